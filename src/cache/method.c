/* The named methods of docs/FORMAT.md section 1 and parameter validation. */
#include <math.h>
#include <string.h>

#include "core/status.h"

typedef struct {
    const char *name;
    int fp16, sink, value_bits;
    float alpha;
    /* beyond the paper (docs/FORMAT.md section 5): 0 for the paper's methods */
    int eager, pairs, clip, value_clip;
    kkv_rot value_rot;
    int window;        /* R (the paper's: 128) */
    kkv_budget budget;
    int key_bits;      /* 2 (4 where boosted) or 8 */
} named_method;

/* KIVI methods are the Kitty lifecycle with no boost (alpha 0: 2-bit keys,
 * alpha 1: 4-bit keys); S = 32 for the starred ('s') variants. */
static const named_method methods[] = {
    {"fp16", 1, 0, 2, 0.0f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kivi-k2v2", 0, 0, 2, 0.0f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kivi-k2v2s", 0, 32, 2, 0.0f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kivi-k4v2s", 0, 32, 2, 1.0f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kivi-k2v4s", 0, 32, 4, 0.0f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kivi-k4v4", 0, 0, 4, 1.0f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kitty", 0, 32, 2, 0.125f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    {"kitty-pro", 0, 32, 2, 0.25f, 0, 0, 0, 0, KKV_ROT_NONE, 128, KKV_BUDGET_NONE, 2},
    /* Calibration-free, at kitty's / kitty-pro's bits (+0.05; docs/RESULTS.md
     * "Beyond the paper"): eager values free the value Q-buffer's fp16 bytes,
     * which buy more boosted channels; whole RoPE pairs; least-squares key
     * ranges; values rotated (random, so any head_dim works). kitty-plus-pro
     * also pools its boost budget over a layer's heads and spends 32 window
     * values' fp16 bytes on 4 more channels (docs/RESULTS.md, "Budget
     * allocation and the fp16 parts"); its pairs did not pay there. */
    {"kitty-plus", 0, 32, 2, 0.3125f, 1, 1, 1, 0, KKV_ROT_RANDOM, 128, KKV_BUDGET_NONE, 2},
    {"kitty-plus-pro", 0, 32, 2, 0.515625f, 1, 0, 1, 0, KKV_ROT_RANDOM, 96, KKV_BUDGET_HEAD, 2},
    /* The 8-bit point of the memory/fidelity frontier (docs/RESULTS.md,
     * "Memory vs fidelity"): keys per channel and values per token in 8 bits,
     * values quantized as they arrive; at 8 bits a 32-token fp16 sink and a
     * 128-token window cost 0.15 bits/element at 4K and bought no KL. */
    {"kivi-k8v8", 0, 0, 8, 0.0f, 1, 0, 0, 0, KKV_ROT_NONE, 0, KKV_BUDGET_NONE, 8},
};
#define N_METHODS (sizeof methods / sizeof methods[0])

static const char *const names[N_METHODS + 1] = {
    "fp16", "kivi-k2v2", "kivi-k2v2s", "kivi-k4v2s", "kivi-k2v4s",
    "kivi-k4v4", "kitty", "kitty-pro", "kitty-plus", "kitty-plus-pro", "kivi-k8v8", NULL,
};

const char *const *kkv_method_names(void) { return names; }

kkv_status kkv_method_from_name(kkv_method *out, const char *name) {
    if (!out) return kkv_fail(KKV_ERR_INVALID_ARG, "method_from_name: out is NULL");
    if (!name) return kkv_fail(KKV_ERR_INVALID_ARG, "method_from_name: name is NULL");
    for (size_t i = 0; i < N_METHODS; i++) {
        if (!name || strcmp(name, methods[i].name)) continue;
        const named_method *m = &methods[i];
        memset(out, 0, sizeof *out);
        out->fp16 = m->fp16;
        /* fp16 keeps whole fp16 pages: no sink or window is needed */
        out->sink = m->fp16 ? 0 : m->sink;
        out->group = 128;
        out->window = m->fp16 ? 0 : m->window;
        out->alpha = m->alpha;
        out->value_bits = m->value_bits;
        out->select = KKV_SELECT_MAGNITUDE;
        out->seed = 0;
        out->eager_values = m->eager;
        out->pairs = m->pairs;
        out->clip = m->clip;
        out->value_clip = m->value_clip;
        out->value_rot = m->value_rot;
        out->budget = m->budget;
        out->key_bits = m->key_bits;
        return KKV_OK;
    }
    char shown[64];
    kkv_printable(shown, sizeof shown, name, strlen(name));
    return kkv_fail(KKV_ERR_NOT_FOUND,
                    "unknown method '%s' (fp16, kivi-k2v2, kivi-k2v2s, kivi-k4v2s, "
                    "kivi-k2v4s, kivi-k4v4, kitty, kitty-pro, kitty-plus, kitty-plus-pro, "
                    "kivi-k8v8)",
                    shown);
}

int kkv_method_boost(const kkv_method *m, int head_dim) {
    if (!m || head_dim < 0) return 0;
    if (m->fp16 || !(m->alpha > 0.0f)) return 0;
    if (m->alpha >= 1.0f) return head_dim;
    return (int)lround((double)m->alpha * head_dim);
}

kkv_status kkv_method_check(const kkv_method *m, int head_dim) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "method is NULL");
    if (head_dim < 4 || head_dim > KKV_MAX_HEAD_DIM || head_dim % 4)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "head_dim %d is not supported: it must be a multiple of 4 in 4..%d",
                        head_dim, KKV_MAX_HEAD_DIM);
    if (m->group < 4 || m->group > 4096 || m->group % 4)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "group (page size) %d must be a multiple of 4 in 4..4096", m->group);
    if (m->sink < 0 || m->sink > (1 << 20))
        return kkv_fail(KKV_ERR_INVALID_ARG, "sink %d must be in 0..1048576", m->sink);
    if (m->window < 0 || m->window > (1 << 20))
        return kkv_fail(KKV_ERR_INVALID_ARG, "window %d must be in 0..1048576", m->window);
    if (!(m->alpha >= 0.0f && m->alpha <= 1.0f))
        return kkv_fail(KKV_ERR_INVALID_ARG, "alpha %g must be in [0, 1]", (double)m->alpha);
    if (m->value_bits != 2 && m->value_bits != 4 && m->value_bits != 8)
        return kkv_fail(KKV_ERR_INVALID_ARG, "value_bits %d must be 2, 4 or 8", m->value_bits);
    if (m->key_bits != 0 && m->key_bits != 2 && m->key_bits != 8)
        return kkv_fail(KKV_ERR_INVALID_ARG, "key_bits %d must be 2 or 8", m->key_bits);
    if (m->key_bits == 8 && !m->fp16 && (m->alpha != 0.0f || m->clip || m->pairs))
        return kkv_fail(KKV_ERR_INVALID_ARG, "8-bit keys have no boost or range search: "
                        "alpha must be 0, clip and pairs off");
    if (m->value_bits == 8 && m->value_clip)
        return kkv_fail(KKV_ERR_INVALID_ARG, "8-bit values have no range search: vclip is off");
    if ((unsigned)m->select > KKV_SELECT_RANGE)
        return kkv_fail(KKV_ERR_INVALID_ARG, "unknown channel selection %d", (int)m->select);
    if ((unsigned)m->key_rot > KKV_ROT_RANDOM || (unsigned)m->value_rot > KKV_ROT_RANDOM)
        return kkv_fail(KKV_ERR_INVALID_ARG, "unknown rotation %d / %d", (int)m->key_rot,
                        (int)m->value_rot);
    if ((m->key_rot == KKV_ROT_HADAMARD || m->value_rot == KKV_ROT_HADAMARD) &&
        (head_dim & (head_dim - 1)))
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "a Hadamard rotation needs a power-of-2 head_dim, not %d (use random)",
                        head_dim);
    if ((m->pairs | m->clip | m->value_clip) & ~1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "pairs, clip and value_clip are 0 or 1");
    if (m->pairs && m->key_rot != KKV_ROT_NONE)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "pairs cannot be combined with a key rotation (it mixes the rotary pairs)");
    if (m->fp16 && (m->pairs || m->key_rot || m->value_rot || m->clip || m->value_clip ||
                    m->budget || m->sink_int8 || m->window_int8))
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "fp16 takes no pairs, rotation, clipping, budget or int8 parts");
    if ((unsigned)m->budget > KKV_BUDGET_ERR)
        return kkv_fail(KKV_ERR_INVALID_ARG, "unknown budget %d", (int)m->budget);
    if (m->budget && (!(m->alpha > 0.0f && m->alpha < 1.0f) ||
                      m->select == KKV_SELECT_RANDOM || m->select == KKV_SELECT_EXPLICIT))
        return kkv_fail(KKV_ERR_INVALID_ARG, "budget needs 0 < alpha < 1 and select magnitude, "
                        "variance or range");
    if ((m->sink_int8 | m->window_int8) & ~1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "sink_int8 and window_int8 are 0 or 1");
    return KKV_OK;
}
