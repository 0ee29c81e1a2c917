/* What the GGUF loader (load.c) hands the graph builder (model.c): the architecture's table row,
 * the public model info, and which optional layer tensors the file carries. Declarations only. */
#pragma once

#include "gguf/gguf.h"
#include "model/arch.h"

typedef struct kiln_model_desc {
    const kiln_arch *arch;  /* table row of general.architecture */
    kiln_model_info  info;  /* sizes and features (public view) */
    uint32_t         roles; /* KILN_ROLE_BIT set of the layer tensors present in every layer */
} kiln_model_desc;

/* Reads and checks f (metadata keys, every tensor's name, shape and type, and that every tensor
 * of the file is used): the rules of kiln_model_info_get in kiln.h. Errors name the key or tensor. */
kiln_status kiln_model_desc_read(const kiln_gguf *f, kiln_model_desc *out);
