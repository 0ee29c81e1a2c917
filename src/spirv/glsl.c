/* The GLSL printer: one kir kernel -> GLSL 450 compute source, from a table of op -> text and one
 * loop over the instructions (tinygrad's renderers are the model). Every value is a variable
 * declared at the top of main(), so values defined inside loops and ifs are visible after them.
 * Must not change what a kernel computes: target fix-ups belong in the lowering, and optional
 * device features are only used where the text computes the same bits as the fallback. */
#include "spirv/spirv.h"
#include "util/sbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef kiln_sbuf sbuf;

/* Text of each op: $a $b $c are the operands, $i the immediate, $s the slot/array (imm), $o the
 * base word offset of slot $s. A type-specific entry wins over `any`. Ops whose text depends on
 * more than the result type (CVT, BITCAST, REDUCE, memory, control flow) are printed in code. */
typedef struct op_text {
    const char *any, *f32, *i32, *u32;
} op_text;

static const op_text op_texts[KILN_KOP_COUNT] = {
    [KILN_KOP_TID] = {"int(gl_LocalInvocationID.x)"},
    [KILN_KOP_PARAM] = {"int(b0.w[pc.off[0] + $iu])"},
    [KILN_KOP_VAR] = {"$a"},
    [KILN_KOP_ADD] = {"$a + $b"},
    [KILN_KOP_SUB] = {"$a - $b"},
    [KILN_KOP_MUL] = {"$a * $b"},
    [KILN_KOP_DIV] = {"$a / $b", .f32 = "kiln_fdiv($a, $b)"},
    [KILN_KOP_REM] = {"$a % $b", .i32 = "$a - ($a / $b) * $b"}, /* C remainder, sign of a */
    [KILN_KOP_MIN] = {"min($a, $b)"},
    [KILN_KOP_MAX] = {"max($a, $b)"},
    [KILN_KOP_FMA] = {"fma($a, $b, $c)"},
    [KILN_KOP_NEG] = {"-$a"},
    [KILN_KOP_ABS] = {"abs($a)"},
    [KILN_KOP_AND] = {"$a & $b"},
    [KILN_KOP_OR] = {"$a | $b"},
    [KILN_KOP_XOR] = {"$a ^ $b"},
    [KILN_KOP_SHL] = {"$a << $b"},
    [KILN_KOP_SHR] = {"$a >> $b"}, /* arithmetic on int, logical on uint, as kir says */
    [KILN_KOP_EX2] = {"exp2($a)"},
    [KILN_KOP_LG2] = {"log2($a)"},
    [KILN_KOP_RSQRT] = {"inversesqrt($a)"},
    [KILN_KOP_SQRT] = {"sqrt($a)"},
    [KILN_KOP_SIN] = {"sin($a)"},
    [KILN_KOP_COS] = {"cos($a)"},
    [KILN_KOP_FLOOR] = {"floor($a)"},
    [KILN_KOP_RINT] = {"roundEven($a)"},
    [KILN_KOP_LT] = {"$a < $b"},
    [KILN_KOP_LE] = {"$a <= $b"},
    [KILN_KOP_EQ] = {"$a == $b"},
    [KILN_KOP_NE] = {"$a != $b"},
    [KILN_KOP_PAND] = {"$a && $b"},
    [KILN_KOP_POR] = {"$a || $b"},
    [KILN_KOP_PNOT] = {"!$a"},
    [KILN_KOP_SELECT] = {"$a ? $b : $c"},
    [KILN_KOP_H2F] = {"unpackHalf2x16($a)[$i]"},
    [KILN_KOP_B2F] = {"uintBitsToFloat($i != 0 ? ($a & 0xffff0000u) : ($a << 16))"},
    [KILN_KOP_F2H] = {"packHalf2x16(vec2($a, 0.0)) & 0xffffu"},
    [KILN_KOP_F2B] = {"kiln_f2b($a)"},
    [KILN_KOP_BFE] = {"bitfieldExtract($a, $f, $w)", .i32 = "bitfieldExtract(int($a), $f, $w)"},
    [KILN_KOP_DP4A] = {"kiln_dp4a($a, $b, $c)"},
    [KILN_KOP_LANE] = {"$a[$i]"},
    [KILN_KOP_LD] = {"b$s.w[$o + uint($a)]"},
    [KILN_KOP_LD4] = {"uvec4(b$s.w[$o + uint($a)], b$s.w[$o + uint($a) + 1u], b$s.w[$o + uint($a) + 2u], b$s.w[$o + uint($a) + 3u])"},
    [KILN_KOP_LDS] = {"s$s[$a]", .f32 = "uintBitsToFloat(s$s[$a])"},
    [KILN_KOP_LDS4] = {"uvec4(s$s[$a], s$s[$a + 1], s$s[$a + 2], s$s[$a + 3])"},
};

static const char *const type_names[KILN_KT_COUNT] = {
    [KILN_KT_PRED] = "bool", [KILN_KT_I32] = "int", [KILN_KT_U32] = "uint", [KILN_KT_F32] = "float", [KILN_KT_V4] = "uvec4", [KILN_KT_F4] = "vec4",
};

static const char *const helpers =
    "// IEEE-rounded f32 division: Vulkan allows 2.5 ulp for '/', and fma() may round twice (lavapipe's\n"
    "// does), so the residual a - q*b is computed exactly by Dekker's product (Veltkamp splits)\n"
    "float kiln_fdiv(float a, float b)\n{\n"
    "    precise float q = a / b;\n"
    "    precise float p = q * b, cq = 4097.0 * q, cb = 4097.0 * b;\n"
    "    precise float qh = cq - (cq - q), bh = cb - (cb - b), ql = q - qh, bl = b - bh;\n"
    "    precise float e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;\n"
    "    precise float c = q + ((a - p) - e) / b;\n"
    "    return isinf(q) || isnan(c) || isinf(c) || isinf(cq) || isinf(cb) ? q : c;\n}\n"
    "// bf16 bits of f32, round to nearest even, NaN stays NaN\n"
    "uint kiln_f2b(float x)\n{\n"
    "    uint u = floatBitsToUint(x);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;\n"
    "    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n}\n";

static const char *const dp4a_bytes =
    "// c + sum of the four signed byte products, wrapping (not saturating)\n"
    "int kiln_dp4a(uint a, uint b, int c)\n{\n"
    "    ivec4 x = ivec4(bitfieldExtract(int(a), 0, 8), bitfieldExtract(int(a), 8, 8), bitfieldExtract(int(a), 16, 8), bitfieldExtract(int(a), 24, 8));\n"
    "    ivec4 y = ivec4(bitfieldExtract(int(b), 0, 8), bitfieldExtract(int(b), 8, 8), bitfieldExtract(int(b), 16, 8), bitfieldExtract(int(b), 24, 8));\n"
    "    return c + x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;\n}\n";

/* a*b is exact in f64, so one f64 add and the final rounding give fma but for rare double roundings */
static const char *const fma_f64 =
    "// fma rounded (almost always) once on a device whose fma() rounds twice\n"
    "float kiln_fma(float a, float b, float c) { precise double p = double(a) * double(b); return float(p + double(c)); }\n";

static const char *const mma_helpers =
    "// element e (0: low half) of a word of two f16 / two bf16\n"
    "float kiln_hf(uint w, uint e) { return unpackHalf2x16(w)[e]; }\n"
    "float kiln_bf(uint w, uint e) { return uintBitsToFloat(e != 0u ? (w & 0xffff0000u) : (w << 16)); }\n";

/* glslang 12 has no GL_EXT_integer_dot_product: OpSDot (4450) with capabilities DotProduct (6019)
 * and DotProductInput4x8BitPacked (6018), packed format 0 = 4x8 bit. */
static const char *const dp4a_ext =
    "// c + sum of the four signed byte products: the non-saturating packed dot product (OpSDot)\n"
    "spirv_instruction(extensions = [\"SPV_KHR_integer_dot_product\"], capabilities = [6019, 6018], id = 4450)\n"
    "int kiln_sdot(uint a, uint b, spirv_literal int packed_format);\n"
    "int kiln_dp4a(uint a, uint b, int c) { return c + kiln_sdot(a, b, 0); }\n";

static void print_const(sbuf *s, const kiln_kinst *in)
{
    if (in->type == KILN_KT_F4) {
        kiln_kinst one = *in;
        one.type = KILN_KT_F32;
        kiln_sbuf_printf(s, "vec4(");
        print_const(s, &one);
        kiln_sbuf_printf(s, ")");
    } else if (in->type == KILN_KT_U32) {
        kiln_sbuf_printf(s, "%uu", in->imm.u);
    } else if (in->type == KILN_KT_I32) {
        if (in->imm.i == INT32_MIN) kiln_sbuf_printf(s, "(-2147483647 - 1)");
        else kiln_sbuf_printf(s, "%d", in->imm.i);
    } else {
        float f;
        memcpy(&f, &in->imm.u, 4);
        char t[48];
        snprintf(t, sizeof t, "%.9g", f);
        float back = strtof(t, NULL);
        bool exact = f - f == 0 && memcmp(&back, &f, 4) == 0; /* finite and round-trips */
        if (!exact) kiln_sbuf_printf(s, "uintBitsToFloat(0x%08xu)", in->imm.u);
        else kiln_sbuf_printf(s, "%s%s", t, strpbrk(t, ".en") ? "" : ".0");
    }
}

/* Expands a template; false for an unknown placeholder (a bug in the table). */
static bool print_template(sbuf *s, const char *t, const kiln_kinst *in)
{
    for (const char *p = t; *p; p++) {
        if (*p != '$') {
            kiln_sbuf_printf(s, "%c", *p);
            continue;
        }
        switch (*++p) {
        case 'a': kiln_sbuf_printf(s, "v%u", in->a); break;
        case 'b': kiln_sbuf_printf(s, "v%u", in->b); break;
        case 'c': kiln_sbuf_printf(s, "v%u", in->c); break;
        case 'i': kiln_sbuf_printf(s, "%d", in->imm.i); break;
        case 's': kiln_sbuf_printf(s, "%u", in->imm.u); break;
        case 'o': kiln_sbuf_printf(s, "pc.off[%u]", in->imm.u); break;
        case 'f': kiln_sbuf_printf(s, "%d", in->imm.i & 31); break;
        case 'w': kiln_sbuf_printf(s, "%d", in->imm.i >> 8); break;
        default: return false;
        }
    }
    return true;
}

static void print_convert(sbuf *s, const kiln_kir *k, const kiln_kinst *in)
{
    enum kiln_kt to = in->type, from = kiln_ktype(k, in->a);
    const char *f = "%s";
    if (to == from) f = "v%u";
    else if (in->op == KILN_KOP_CVT) f = to == KILN_KT_F32 ? "float(v%u)" : to == KILN_KT_I32 ? "int(v%u)" : "uint(v%u)";
    else if (to == KILN_KT_F32) f = from == KILN_KT_I32 ? "intBitsToFloat(v%u)" : "uintBitsToFloat(v%u)";
    else if (from == KILN_KT_F32) f = to == KILN_KT_I32 ? "floatBitsToInt(v%u)" : "floatBitsToUint(v%u)";
    else f = to == KILN_KT_I32 ? "int(v%u)" : "uint(v%u)";
    kiln_sbuf_printf(s, f, in->a);
}

typedef struct reduce_plan {
    bool     subgroup; /* use subgroup arithmetic */
    uint32_t sg;       /* subgroup size when subgroup */
} reduce_plan;

static reduce_plan plan_reduce(const kiln_kir *k, const kiln_spv_features *f, uint32_t grp)
{
    uint32_t sg = f ? f->subgroup_size : 0;
    bool ok = f && f->subgroup_arith && sg && (sg & (sg - 1)) == 0 && k->block % sg == 0 &&
              (grp == sg || (grp < sg && f->subgroup_clustered) || (grp > sg && grp % sg == 0));
    return (reduce_plan){.subgroup = ok, .sg = sg};
}

static void print_reduce(sbuf *s, const kiln_kir *k, const kiln_spv_features *f, const kiln_kinst *in, uint32_t id,
                         const char *ind)
{
    uint32_t grp = in->imm.u & 0xffff;
    bool max = (in->imm.u >> 16) == KILN_KRED_MAX;
    const char *sg_op = max ? "Max" : "Add";
    const char *comb = max ? "max(%s, %s)" : "%s + %s";
    reduce_plan p = plan_reduce(k, f, grp);
    if (p.subgroup && grp == p.sg) {
        kiln_sbuf_printf(s, "%sv%u = subgroup%s(v%u);\n", ind, id, sg_op, in->a);
        return;
    }
    if (p.subgroup && grp < p.sg) {
        kiln_sbuf_printf(s, "%sv%u = subgroupClustered%s(v%u, %uu);\n", ind, id, sg_op, in->a, grp);
        return;
    }
    kiln_sbuf_printf(s, "%s{\n", ind);
    kiln_sbuf_printf(s, "%s    uint t_ = gl_LocalInvocationID.x;\n", ind);
    char c[64];
    if (p.subgroup) { /* subgroups first, then their partials through shared memory */
        kiln_sbuf_printf(s, "%s    float r_ = subgroup%s(v%u);\n", ind, sg_op, in->a);
        kiln_sbuf_printf(s, "%s    if (gl_SubgroupInvocationID == 0u) kiln_red[t_ / %uu] = r_;\n", ind, p.sg);
        kiln_sbuf_printf(s, "%s    barrier();\n", ind);
        kiln_sbuf_printf(s, "%s    uint g_ = (t_ & ~%uu) / %uu;\n", ind, grp - 1, p.sg);
        kiln_sbuf_printf(s, "%s    r_ = kiln_red[g_];\n", ind);
        snprintf(c, sizeof c, comb, "r_", "kiln_red[g_ + j_]");
        kiln_sbuf_printf(s, "%s    for (uint j_ = 1u; j_ < %uu; j_++) r_ = %s;\n", ind, grp / p.sg, c);
        kiln_sbuf_printf(s, "%s    v%u = r_;\n", ind, id);
    } else { /* shared-memory tree */
        kiln_sbuf_printf(s, "%s    kiln_red[t_] = v%u;\n", ind, in->a);
        kiln_sbuf_printf(s, "%s    barrier();\n", ind);
        snprintf(c, sizeof c, comb, "kiln_red[t_]", "kiln_red[t_ + s_]");
        kiln_sbuf_printf(s, "%s    for (uint s_ = %uu; s_ > 0u; s_ >>= 1) {\n", ind, grp / 2);
        kiln_sbuf_printf(s, "%s        if ((t_ & %uu) < s_) kiln_red[t_] = %s;\n", ind, grp - 1, c);
        kiln_sbuf_printf(s, "%s        barrier();\n", ind);
        kiln_sbuf_printf(s, "%s    }\n", ind);
        kiln_sbuf_printf(s, "%s    v%u = kiln_red[t_ & ~%uu];\n", ind, id, grp - 1);
    }
    kiln_sbuf_printf(s, "%s    barrier(); // kiln_red is free again\n", ind);
    kiln_sbuf_printf(s, "%s}\n", ind);
}

/* MMA (m16n8k16, kir.h states the fragment layouts): every thread puts its A and B words into
 * kiln_mma, and then computes its four D elements from its warp's words. Products of two f16 or
 * bf16 values are exact in f32, so each step rounds once (D + a*b) whether or not it is fused. */
static void print_mma(sbuf *s, const kiln_kinst *in, uint32_t id, const char *ind)
{
    const char *h = (in->imm.u & 1) ? "kiln_bf" : "kiln_hf";
    uint32_t b = (in->imm.u & 2) ? 2 : 0;
    kiln_sbuf_printf(s, "%s{\n%s    uint t_ = gl_LocalInvocationID.x, l_ = t_ & 31u, w_ = t_ - l_, g_ = l_ >> 2, q_ = l_ & 3u;\n", ind, ind);
    for (int j = 0; j < 4; j++) kiln_sbuf_printf(s, "%s    kiln_mma[t_ * 6u + %du] = v%u[%d];\n", ind, j, in->a, j);
    for (int j = 0; j < 2; j++) kiln_sbuf_printf(s, "%s    kiln_mma[t_ * 6u + %du] = v%u[%u];\n", ind, 4 + j, in->b, b + (uint32_t)j);
    kiln_sbuf_printf(s, "%s    memoryBarrierShared();\n%s    barrier();\n%s    vec4 d_ = v%u;\n", ind, ind, ind, in->c);
    kiln_sbuf_printf(s, "%s    for (uint k_ = 0u; k_ < 16u; k_++) {\n", ind);
    kiln_sbuf_printf(s, "%s        uint p_ = (k_ & 7u) >> 1, j_ = k_ >> 3, e_ = k_ & 1u;\n", ind);
    kiln_sbuf_printf(s, "%s        float a0_ = %s(kiln_mma[(w_ + g_ * 4u + p_) * 6u + 2u * j_], e_);\n", ind, h);
    kiln_sbuf_printf(s, "%s        float a1_ = %s(kiln_mma[(w_ + g_ * 4u + p_) * 6u + 2u * j_ + 1u], e_);\n", ind, h);
    kiln_sbuf_printf(s, "%s        float b0_ = %s(kiln_mma[(w_ + q_ * 8u + p_) * 6u + 4u + j_], e_);\n", ind, h);
    kiln_sbuf_printf(s, "%s        float b1_ = %s(kiln_mma[(w_ + q_ * 8u + 4u + p_) * 6u + 4u + j_], e_);\n", ind, h);
    kiln_sbuf_printf(s, "%s        d_ = vec4(d_.x + a0_ * b0_, d_.y + a0_ * b1_, d_.z + a1_ * b0_, d_.w + a1_ * b1_);\n%s    }\n", ind, ind);
    kiln_sbuf_printf(s, "%s    memoryBarrierShared();\n%s    barrier(); // kiln_mma is free again\n%s    v%u = d_;\n%s}\n", ind, ind, ind, id, ind);
}

static void print_st16(sbuf *s, const kiln_spv_features *f, const kiln_kinst *in, const char *ind)
{
    uint32_t sl = in->imm.u;
    if (f && f->storage16) {
        kiln_sbuf_printf(s, "%sh%u.h[pc.off[%u] * 2u + uint(v%u)] = uint16_t(v%u & 0xffffu);\n", ind, sl, sl, in->a, in->b);
        return;
    }
    /* the other half of the word may be stored by another thread at the same time */
    kiln_sbuf_printf(s, "%s{\n%s    uint i_ = uint(v%u), w_ = pc.off[%u] + (i_ >> 1), sh_ = (i_ & 1u) * 16u;\n", ind, ind, in->a, sl);
    kiln_sbuf_printf(s, "%s    atomicAnd(b%u.w[w_], ~(0xffffu << sh_));\n", ind, sl);
    kiln_sbuf_printf(s, "%s    atomicOr(b%u.w[w_], (v%u & 0xffffu) << sh_);\n%s}\n", ind, sl, in->b, ind);
}

/* Everything before main(): extensions, buffers, shared arrays, helpers. */
static void print_header(sbuf *s, const kiln_kir *k, const kiln_spv_features *f)
{
    bool st16[KILN_KIR_MAX_BUFS] = {false}, any16 = false, sg = false, sg_basic = false, clustered = false, dp4a = false, fma = false;
    bool mma = false;
    uint32_t red = 0;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        const kiln_kinst *in = &k->ins[i];
        if (in->op == KILN_KOP_ST16) st16[in->imm.u] = any16 = f && f->storage16;
        if (in->op == KILN_KOP_DP4A) dp4a = true;
        if (in->op == KILN_KOP_MMA) mma = true;
        if (in->op == KILN_KOP_FMA) fma = f && f->fma_f64;
        if (in->op != KILN_KOP_REDUCE) continue;
        uint32_t grp = in->imm.u & 0xffff;
        reduce_plan p = plan_reduce(k, f, grp);
        sg |= p.subgroup;
        clustered |= p.subgroup && grp < p.sg;
        if (p.subgroup && grp > p.sg) {
            sg_basic = true;
            if (red < k->block / p.sg) red = k->block / p.sg;
        } else if (!p.subgroup) {
            red = k->block;
        }
    }
    kiln_sbuf_printf(s, "#version 450\n");
    if (any16) kiln_sbuf_printf(s, "#extension GL_EXT_shader_16bit_storage : require\n");
    if (any16) kiln_sbuf_printf(s, "#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require\n");
    if (sg_basic) kiln_sbuf_printf(s, "#extension GL_KHR_shader_subgroup_basic : require\n");
    if (sg) kiln_sbuf_printf(s, "#extension GL_KHR_shader_subgroup_arithmetic : require\n");
    if (clustered) kiln_sbuf_printf(s, "#extension GL_KHR_shader_subgroup_clustered : require\n");
    if (dp4a && f && f->int_dot) kiln_sbuf_printf(s, "#extension GL_EXT_spirv_intrinsics : require\n");
    char what[sizeof k->what];
    snprintf(what, sizeof what, "%s", k->what);
    for (char *c = what; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    kiln_sbuf_printf(s, "// kiln kernel %s: %s\n", k->name, what);
    kiln_sbuf_printf(s, "layout(local_size_x = %u) in;\n", k->block);
    kiln_sbuf_printf(s, "// base word offset of each buffer slot, added to every index into it\n");
    kiln_sbuf_printf(s, "layout(push_constant, std430) uniform kiln_pc { uint off[%u]; } pc;\n", KILN_SPV_PUSH_WORDS);
    for (uint32_t b = 0; b < k->n_bufs; b++) {
        static const char *const kinds[KILN_KBUF_KIND_COUNT] = {"parameters", "node", "table", "scratch"};
        const kiln_kbuf *kb = &k->bufs[b];
        kiln_sbuf_printf(s, "layout(std430, set = 0, binding = %u) %sbuffer kiln_b%u { uint w[]; } b%u; // %s", b,
                  kb->written ? "" : "readonly ", b, b, kb->kind < KILN_KBUF_KIND_COUNT ? kinds[kb->kind] : "?");
        if (kb->kind != KILN_KBUF_PARAMS) kiln_sbuf_printf(s, " %u", kb->node);
        kiln_sbuf_printf(s, "\n");
        if (st16[b]) kiln_sbuf_printf(s, "layout(std430, set = 0, binding = %u) buffer kiln_h%u { uint16_t h[]; } h%u;\n", b, b, b);
    }
    for (uint32_t a = 0; a < k->n_shared; a++) kiln_sbuf_printf(s, "shared uint s%u[%u];\n", a, k->shared[a]);
    if (red) kiln_sbuf_printf(s, "shared float kiln_red[%u];\n", red);
    if (mma) kiln_sbuf_printf(s, "shared uint kiln_mma[%u]; // MMA: each thread's A and B fragment words\n", 6 * k->block);
    kiln_sbuf_printf(s, "%s", helpers);
    if (dp4a) kiln_sbuf_printf(s, "%s", f && f->int_dot ? dp4a_ext : dp4a_bytes);
    if (fma) kiln_sbuf_printf(s, "%s", fma_f64);
    if (mma) kiln_sbuf_printf(s, "%s", mma_helpers);
}

/* One line per type naming every value of that type. */
static void print_decls(sbuf *s, const kiln_kir *k)
{
    for (int t = KILN_KT_PRED; t < KILN_KT_COUNT; t++) {
        uint32_t on_line = 0;
        for (uint32_t i = 0; i < k->n_ins; i++) {
            if (k->ins[i].type != t || k->ins[i].op == KILN_KOP_NONE) continue;
            if (on_line == 0) kiln_sbuf_printf(s, "    %s v%u", type_names[t], i);
            else kiln_sbuf_printf(s, ", v%u", i);
            if (++on_line == 16) {
                kiln_sbuf_printf(s, ";\n");
                on_line = 0;
            }
        }
        if (on_line) kiln_sbuf_printf(s, ";\n");
    }
}

/* An arithmetic instruction through its op_texts template (kiln_fma for FMA where the device's fma
 * rounds twice). */
static kiln_status print_alu(sbuf *s, const kiln_kir *k, const kiln_spv_features *f, const kiln_kinst *in, uint32_t i,
                             const char *ind, char *err, size_t n)
{
    enum kiln_kop op = (enum kiln_kop)in->op;
    const op_text *t = op < KILN_KOP_COUNT ? &op_texts[op] : NULL;
    const char *tx = op == KILN_KOP_FMA && f && f->fma_f64 ? "kiln_fma($a, $b, $c)"
        : !t ? NULL
        : in->type == KILN_KT_F32 && t->f32 ? t->f32
        : in->type == KILN_KT_I32 && t->i32 ? t->i32
        : in->type == KILN_KT_U32 && t->u32 ? t->u32 : t->any;
    if (!tx) {
        snprintf(err, n, "kernel %s, instruction %u: the GLSL printer does not take op %s", k->name, i, kiln_kop_name(op));
        return KILN_ERR_UNSUPPORTED;
    }
    kiln_sbuf_printf(s, "%sv%u = ", ind, i);
    if (!print_template(s, tx, in)) {
        snprintf(err, n, "GLSL printer: bad template for op %s", kiln_kop_name(op));
        return KILN_ERR_INTERNAL;
    }
    kiln_sbuf_printf(s, ";\n");
    return KILN_OK;
}

/* Instruction i at indentation ind. */
static kiln_status print_ins(sbuf *s, const kiln_kir *k, const kiln_spv_features *f, uint32_t i, const char *ind, char *err,
                             size_t n)
{
    const kiln_kinst *in = &k->ins[i];
    switch ((enum kiln_kop)in->op) {
    case KILN_KOP_CONST: kiln_sbuf_printf(s, "%sv%u = ", ind, i); print_const(s, in); kiln_sbuf_printf(s, ";\n"); break;
    case KILN_KOP_BID: kiln_sbuf_printf(s, "%sv%u = int(gl_WorkGroupID.%c);\n", ind, i, "xyz"[in->imm.u % 3]); break;
    case KILN_KOP_NBID: kiln_sbuf_printf(s, "%sv%u = int(gl_NumWorkGroups.%c);\n", ind, i, "xyz"[in->imm.u % 3]); break;
    case KILN_KOP_CVT: case KILN_KOP_BITCAST: kiln_sbuf_printf(s, "%sv%u = ", ind, i); print_convert(s, k, in); kiln_sbuf_printf(s, ";\n"); break;
    case KILN_KOP_ASSIGN: kiln_sbuf_printf(s, "%sv%u = v%u;\n", ind, in->a, in->b); break;
    case KILN_KOP_ST: kiln_sbuf_printf(s, "%sb%u.w[pc.off[%u] + uint(v%u)] = v%u;\n", ind, in->imm.u, in->imm.u, in->a, in->b); break;
    case KILN_KOP_ST16: print_st16(s, f, in, ind); break;
    case KILN_KOP_STS:
        kiln_sbuf_printf(s, kiln_ktype(k, in->b) == KILN_KT_F32 ? "%ss%u[v%u] = floatBitsToUint(v%u);\n" : "%ss%u[v%u] = v%u;\n", ind,
                  in->imm.u, in->a, in->b);
        break;
    case KILN_KOP_BARRIER: kiln_sbuf_printf(s, "%smemoryBarrierShared();\n%sbarrier();\n", ind, ind); break;
    case KILN_KOP_REDUCE: print_reduce(s, k, f, in, i, ind); break;
    case KILN_KOP_MMA: print_mma(s, in, i, ind); break;
    case KILN_KOP_SETLANE:
        if (in->a != KILN_IDX_NONE) kiln_sbuf_printf(s, "%sv%u = v%u;\n", ind, i, in->a);
        else kiln_sbuf_printf(s, in->type == KILN_KT_F4 ? "%sv%u = vec4(0.0);\n" : "%sv%u = uvec4(0u);\n", ind, i);
        kiln_sbuf_printf(s, "%sv%u[%d] = v%u;\n", ind, i, in->imm.i, in->b);
        break;
    case KILN_KOP_LOOP: kiln_sbuf_printf(s, "%sfor (; v%u < v%u; v%u += v%u) {\n", ind, in->a, in->b, in->a, in->c); break;
    case KILN_KOP_IF: kiln_sbuf_printf(s, "%sif (v%u) {\n", ind, in->a); break;
    case KILN_KOP_ELSE: kiln_sbuf_printf(s, "%s} else {\n", ind); break;
    case KILN_KOP_ENDLOOP: case KILN_KOP_ENDIF: kiln_sbuf_printf(s, "%s}\n", ind); break;
    /* programmatic dependent launch is CUDA's: a Vulkan queue runs dispatches in order anyway */
    case KILN_KOP_GRID_WAIT: case KILN_KOP_GRID_LAUNCH: case KILN_KOP_PREFETCH: break;
    case KILN_KOP_FENCE_CTA: break; /* a scheduling hint for ptxas; a thread's own accesses are in order anyway */
    default: return print_alu(s, k, f, in, i, ind, err, n);
    }
    return KILN_OK;
}

kiln_status kiln_spv_glsl(const kiln_kir *k, const kiln_spv_features *f, char **out, char *err, size_t n)
{
    *out = NULL;
    if (!kiln_kir_verify(k, err, n)) return KILN_ERR_INTERNAL; /* a lowering bug, as the PTX printer says too */
    for (uint32_t i = 0; i < k->n_ins; i++)
        if ((k->ins[i].op >= KILN_KOP_STS4 && k->ins[i].op <= KILN_KOP_SETMAXNREG) || k->ins[i].op == KILN_KOP_WSET || k->ins[i].op == KILN_KOP_ST4) { /* Hopper's warpgroup MMA and its helpers: sm_90a only */
            snprintf(err, n, "kernel %s, instruction %u: the GLSL printer does not take op %s", k->name, i, kiln_kop_name(k->ins[i].op));
            return KILN_ERR_UNSUPPORTED;
        }
    sbuf s = {0};
    print_header(&s, k, f);
    kiln_sbuf_printf(&s, "void main()\n{\n");
    print_decls(&s, k);
    char spaces[4 * 66 + 1];
    memset(spaces, ' ', sizeof spaces - 1);
    spaces[sizeof spaces - 1] = 0;
    int depth = 1; /* nesting depth; the verifier allows at most 64 open blocks */
    const char *ind = spaces + sizeof spaces - 1 - 4;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        enum kiln_kop op = (enum kiln_kop)k->ins[i].op;
        if (op == KILN_KOP_ENDLOOP || op == KILN_KOP_ENDIF || op == KILN_KOP_ELSE) ind = spaces + sizeof spaces - 1 - 4 * --depth;
        kiln_status st = print_ins(&s, k, f, i, ind, err, n);
        if (st != KILN_OK) {
            free(s.s);
            return st;
        }
        if (op == KILN_KOP_LOOP || op == KILN_KOP_IF || op == KILN_KOP_ELSE) ind = spaces + sizeof spaces - 1 - 4 * ++depth;
    }
    kiln_sbuf_printf(&s, "}\n");
    if (s.oom) {
        free(s.s);
        snprintf(err, n, "out of memory printing kernel %s", k->name);
        return KILN_ERR_NOMEM;
    }
    *out = s.s;
    return KILN_OK;
}
