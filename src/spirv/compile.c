/* GLSL -> SPIR-V 1.3 words (Vulkan 1.1 target) through glslang's C interface, in-process. Errors
 * return glslang's log followed by the offending source line. Must not print the GLSL (glsl.c)
 * nor touch Vulkan objects. Without glslang (KILN_HAVE_VULKAN unset) every call says so. */
#include "spirv/spirv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_HAVE_VULKAN
#include <glslang/Include/glslang_c_interface.h>
#include <glslang/Public/resource_limits_c.h>
#include <pthread.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t compile_lock = PTHREAD_MUTEX_INITIALIZER; /* glslang's globals are not ours to race on */

static void init_glslang(void) { glslang_initialize_process(); }

/* err = what + glslang's log + the GLSL line the first "ERROR: 0:LINE:" names. */
static void explain(const char *what, const char *log, const char *glsl, char *err, size_t n)
{
    int l = snprintf(err, n, "glslang %s failed: %s", what, log && *log ? log : "(no log)\n");
    if (l < 0 || (size_t)l >= n) return;
    const char *e = log ? strstr(log, "ERROR: 0:") : NULL;
    long line = e ? strtol(e + 9, NULL, 10) : 0;
    if (line <= 0) return;
    const char *p = glsl;
    for (long i = 1; i < line && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (!p) return;
    const char *end = strchr(p, '\n');
    int len = end ? (int)(end - p) : (int)strlen(p);
    snprintf(err + l, n - (size_t)l, "GLSL line %ld: %.*s", line, len, p);
}

kiln_status kiln_spv_compile(const char *glsl, uint32_t **words, size_t *n_words, char *err, size_t n)
{
    *words = NULL;
    *n_words = 0;
    pthread_once(&init_once, init_glslang);
    const glslang_input_t in = {
        .language = GLSLANG_SOURCE_GLSL,
        .stage = GLSLANG_STAGE_COMPUTE,
        .client = GLSLANG_CLIENT_VULKAN,
        .client_version = GLSLANG_TARGET_VULKAN_1_1,
        .target_language = GLSLANG_TARGET_SPV,
        .target_language_version = GLSLANG_TARGET_SPV_1_3,
        .code = glsl,
        .default_version = 450,
        .default_profile = GLSLANG_NO_PROFILE,
        .messages = GLSLANG_MSG_DEFAULT_BIT | GLSLANG_MSG_SPV_RULES_BIT | GLSLANG_MSG_VULKAN_RULES_BIT,
        .resource = glslang_default_resource(),
    };
    kiln_status st = KILN_ERR_UNSUPPORTED;
    pthread_mutex_lock(&compile_lock);
    glslang_shader_t *sh = glslang_shader_create(&in);
    glslang_program_t *prog = NULL;
    if (!sh) {
        snprintf(err, n, "glslang: cannot create a shader (out of memory)");
        st = KILN_ERR_NOMEM;
        goto done;
    }
    if (!glslang_shader_preprocess(sh, &in)) {
        explain("preprocessing", glslang_shader_get_info_log(sh), glsl, err, n);
        goto done;
    }
    if (!glslang_shader_parse(sh, &in)) {
        explain("compilation", glslang_shader_get_info_log(sh), glsl, err, n);
        goto done;
    }
    prog = glslang_program_create();
    glslang_program_add_shader(prog, sh);
    if (!glslang_program_link(prog, GLSLANG_MSG_SPV_RULES_BIT | GLSLANG_MSG_VULKAN_RULES_BIT)) {
        explain("linking", glslang_program_get_info_log(prog), glsl, err, n);
        goto done;
    }
    glslang_spv_options_t opt = {.disable_optimizer = true}; /* deterministic; the driver optimizes */
    glslang_program_SPIRV_generate_with_options(prog, GLSLANG_STAGE_COMPUTE, &opt);
    size_t nw = glslang_program_SPIRV_get_size(prog);
    const char *msg = glslang_program_SPIRV_get_messages(prog);
    if (!nw) {
        explain("SPIR-V generation", msg, glsl, err, n);
        goto done;
    }
    *words = malloc(nw * sizeof **words);
    if (!*words) {
        snprintf(err, n, "out of memory for %zu SPIR-V words", nw);
        st = KILN_ERR_NOMEM;
        goto done;
    }
    glslang_program_SPIRV_get(prog, *words);
    *n_words = nw;
    st = KILN_OK;
done:
    if (prog) glslang_program_delete(prog);
    if (sh) glslang_shader_delete(sh);
    pthread_mutex_unlock(&compile_lock);
    return st;
}

#else

kiln_status kiln_spv_compile(const char *glsl, uint32_t **words, size_t *n_words, char *err, size_t n)
{
    (void)glsl;
    *words = NULL;
    *n_words = 0;
    snprintf(err, n, "kiln was built without glslang (install glslang-dev and libvulkan-dev, then rebuild)");
    return KILN_ERR_UNSUPPORTED;
}

#endif
