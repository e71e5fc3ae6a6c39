/* Method specs: a named method with ':key=value' overrides, parsed into a
 * kkv_method and printed back canonically. One parser for every tool. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

#define SPEC_MAX 256 /* longest spec text accepted */

static int parse_u64(uint64_t *out, const char *s) {
    char *end;
    errno = 0;
    if (!*s || *s == '-' || *s == '+' || *s == ' ') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_int(int *out, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    if (!*s || *s == ' ') return -1;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static const char *select_name(kkv_select s) {
    switch (s) {
    case KKV_SELECT_MAGNITUDE: return "magnitude";
    case KKV_SELECT_VARIANCE: return "variance";
    case KKV_SELECT_RANDOM: return "random";
    case KKV_SELECT_EXPLICIT: return "oracle";
    case KKV_SELECT_RANGE: return "range";
    }
    return "?";
}

static const char *rot_name(kkv_rot r) {
    switch (r) {
    case KKV_ROT_NONE: return "none";
    case KKV_ROT_HADAMARD: return "hadamard";
    case KKV_ROT_RANDOM: return "random";
    }
    return "?";
}

static const char *budget_name(kkv_budget b) {
    switch (b) {
    case KKV_BUDGET_NONE: return "none";
    case KKV_BUDGET_HEAD: return "head";
    case KKV_BUDGET_ERR: return "err";
    }
    return "?";
}

static int parse_rot(kkv_rot *out, const char *v) {
    if (!strcmp(v, "none")) *out = KKV_ROT_NONE;
    else if (!strcmp(v, "hadamard")) *out = KKV_ROT_HADAMARD;
    else if (!strcmp(v, "random")) *out = KKV_ROT_RANDOM;
    else return -1;
    return 0;
}

/* Applies one key=value to m; which keys were set go into *set (bit per key). */
enum { SET_ALPHA = 1, SET_SELECT = 2, SET_SEED = 4, SET_SINK = 8, SET_GROUP = 16,
       SET_WINDOW = 32, SET_VBITS = 64, SET_EAGER = 128, SET_PAIRS = 256, SET_ROT = 512,
       SET_VROT = 1024, SET_CLIP = 2048, SET_VCLIP = 4096, SET_BUDGET = 8192,
       SET_SINK8 = 16384, SET_WIN8 = 32768, SET_KBITS = 65536 };

static kkv_status apply(kkv_method *m, unsigned *set, const char *spec, const char *key,
                        const char *val) {
    int bad = 0;
    unsigned bit = 0;
    if (!strcmp(key, "alpha")) {
        char *end;
        errno = 0;
        double a = strtod(val, &end);
        bad = !*val || *end || errno || !(a >= 0.0 && a <= 1.0);
        m->alpha = (float)a;
        bit = SET_ALPHA;
    } else if (!strcmp(key, "select")) {
        if (!strcmp(val, "magnitude")) m->select = KKV_SELECT_MAGNITUDE;
        else if (!strcmp(val, "variance")) m->select = KKV_SELECT_VARIANCE;
        else if (!strcmp(val, "random")) m->select = KKV_SELECT_RANDOM;
        else if (!strcmp(val, "oracle")) m->select = KKV_SELECT_EXPLICIT;
        else if (!strcmp(val, "range")) m->select = KKV_SELECT_RANGE;
        else bad = 1;
        bit = SET_SELECT;
    } else if (!strcmp(key, "seed")) {
        bad = parse_u64(&m->seed, val);
        bit = SET_SEED;
    } else if (!strcmp(key, "sink")) {
        bad = parse_int(&m->sink, val, 0, 1 << 20);
        bit = SET_SINK;
    } else if (!strcmp(key, "group")) {
        bad = parse_int(&m->group, val, 4, 4096) || m->group % 4;
        bit = SET_GROUP;
    } else if (!strcmp(key, "window")) {
        bad = parse_int(&m->window, val, 0, 1 << 20);
        bit = SET_WINDOW;
    } else if (!strcmp(key, "vbits")) {
        bad = parse_int(&m->value_bits, val, 2, 8) ||
              (m->value_bits != 2 && m->value_bits != 4 && m->value_bits != 8);
        bit = SET_VBITS;
    } else if (!strcmp(key, "kbits")) {
        bad = parse_int(&m->key_bits, val, 2, 8) || (m->key_bits != 2 && m->key_bits != 8);
        bit = SET_KBITS;
    } else if (!strcmp(key, "eager")) {
        bad = parse_int(&m->eager_values, val, 0, 1);
        bit = SET_EAGER;
    } else if (!strcmp(key, "pairs")) {
        bad = parse_int(&m->pairs, val, 0, 1);
        bit = SET_PAIRS;
    } else if (!strcmp(key, "rot")) {
        bad = parse_rot(&m->key_rot, val);
        bit = SET_ROT;
    } else if (!strcmp(key, "vrot")) {
        bad = parse_rot(&m->value_rot, val);
        bit = SET_VROT;
    } else if (!strcmp(key, "clip")) {
        bad = parse_int(&m->clip, val, 0, 1);
        bit = SET_CLIP;
    } else if (!strcmp(key, "vclip")) {
        bad = parse_int(&m->value_clip, val, 0, 1);
        bit = SET_VCLIP;
    } else if (!strcmp(key, "budget")) {
        if (!strcmp(val, "none")) m->budget = KKV_BUDGET_NONE;
        else if (!strcmp(val, "head")) m->budget = KKV_BUDGET_HEAD;
        else if (!strcmp(val, "err")) m->budget = KKV_BUDGET_ERR;
        else bad = 1;
        bit = SET_BUDGET;
    } else if (!strcmp(key, "sink8")) {
        bad = parse_int(&m->sink_int8, val, 0, 1);
        bit = SET_SINK8;
    } else if (!strcmp(key, "win8")) {
        bad = parse_int(&m->window_int8, val, 0, 1);
        bit = SET_WIN8;
    } else {
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "method spec '%s': unknown key '%s' (alpha, select, seed, sink, group, "
                        "window, vbits, kbits, eager, pairs, rot, vrot, clip, vclip, budget, sink8, "
                        "win8)", spec, key);
    }
    if (bad)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': bad value '%s' for %s", spec,
                        val, key);
    if (*set & bit)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': %s is given twice", spec, key);
    *set |= bit;
    return KKV_OK;
}

kkv_status kkv_method_parse(kkv_method *out, const char *spec) {
    if (!out || !spec) return kkv_fail(KKV_ERR_INVALID_ARG, "method spec: NULL argument");
    size_t len = strlen(spec);
    if (len == 0 || len >= SPEC_MAX)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec is empty or longer than %d characters",
                        SPEC_MAX - 1);
    char buf[SPEC_MAX]; /* a mutable copy, cut at ':' and '=' */
    memcpy(buf, spec, len + 1);
    char *colon = strchr(buf, ':');
    if (colon) *colon = 0;
    kkv_method m;
    if (kkv_method_from_name(&m, buf) != KKV_OK)
        return kkv_fail(KKV_ERR_NOT_FOUND, "unknown method '%s' in spec '%s' (kittykv --help "
                        "lists them)", buf, spec);
    unsigned set = 0;
    for (char *kv = colon ? colon + 1 : NULL; kv;) {
        char *next = strchr(kv, ':');
        if (next) *next++ = 0;
        char *eq = strchr(kv, '=');
        if (!*kv || !eq || eq == kv)
            return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': '%s' is not key=value", spec,
                            kv);
        *eq = 0;
        KKV_TRY(apply(&m, &set, spec, kv, eq + 1));
        kv = next;
    }
    /* Reject what the method would silently ignore. */
    if (m.fp16 && (set & ~(unsigned)SET_GROUP))
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': fp16 takes no option but group "
                        "(its page size)", spec);
    int partial_boost = m.alpha > 0.0f && m.alpha < 1.0f;
    int rot_seeded = m.key_rot == KKV_ROT_RANDOM || m.value_rot == KKV_ROT_RANDOM;
    if (((set & SET_SELECT) || ((set & SET_PAIRS) && m.pairs)) && !partial_boost)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "method spec '%s': select/pairs choose boosted channels, and alpha %g "
                        "boosts %s", spec, (double)m.alpha, m.alpha > 0.0f ? "all" : "none");
    if ((set & SET_SEED) && !(m.select == KKV_SELECT_RANDOM && partial_boost) && !rot_seeded)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': seed needs select=random or a "
                        "random rotation", spec);
    if (m.pairs && m.key_rot != KKV_ROT_NONE)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': pairs cannot be combined with a "
                        "key rotation (it mixes the rotary pairs)", spec);
    if (m.budget != KKV_BUDGET_NONE &&
        (!partial_boost || m.select == KKV_SELECT_RANDOM || m.select == KKV_SELECT_EXPLICIT))
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': budget pools boosted channels "
                        "by a measured score: it needs 0 < alpha < 1 and select magnitude, "
                        "variance or range", spec);
    if (m.key_bits == 8 && (m.alpha != 0.0f || m.clip || m.pairs))
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': 8-bit keys (kbits=8) have no "
                        "boost or range search: alpha must be 0, clip and pairs off", spec);
    if (m.value_bits == 8 && m.value_clip)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': 8-bit values (vbits=8) have no "
                        "range search: vclip must be off", spec);
    if (m.sink_int8 && m.sink == 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': sink8 needs a sink", spec);
    if (m.window_int8 && m.window == 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method spec '%s': win8 needs a window", spec);
    *out = m;
    return KKV_OK;
}

/* Fields in which a and b differ, as SET_* bits. */
static unsigned differ(const kkv_method *a, const kkv_method *b) {
    unsigned d = 0;
    if (a->alpha != b->alpha) d |= SET_ALPHA;
    if (a->select != b->select) d |= SET_SELECT;
    if (a->seed != b->seed) d |= SET_SEED;
    if (a->sink != b->sink) d |= SET_SINK;
    if (a->group != b->group) d |= SET_GROUP;
    if (a->window != b->window) d |= SET_WINDOW;
    if (a->value_bits != b->value_bits) d |= SET_VBITS;
    if (a->eager_values != b->eager_values) d |= SET_EAGER;
    if (a->pairs != b->pairs) d |= SET_PAIRS;
    if (a->key_rot != b->key_rot) d |= SET_ROT;
    if (a->value_rot != b->value_rot) d |= SET_VROT;
    if (a->clip != b->clip) d |= SET_CLIP;
    if (a->value_clip != b->value_clip) d |= SET_VCLIP;
    if (a->budget != b->budget) d |= SET_BUDGET;
    if (a->sink_int8 != b->sink_int8) d |= SET_SINK8;
    if (a->window_int8 != b->window_int8) d |= SET_WIN8;
    if ((a->key_bits == 8) != (b->key_bits == 8)) d |= SET_KBITS; /* 0 reads as 2 */
    return d;
}

static int popcount(unsigned x) {
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

kkv_status kkv_method_format(char *buf, size_t cap, size_t *n_out, const kkv_method *m) {
    if (!buf || !m) return kkv_fail(KKV_ERR_INVALID_ARG, "method format: NULL argument");
    /* The named method of the same kind (fp16 or not) needing fewest overrides. */
    const char *best = NULL;
    unsigned best_d = 0;
    for (const char *const *n = kkv_method_names(); *n; n++) {
        kkv_method b;
        kkv_method_from_name(&b, *n);
        if (b.fp16 != m->fp16) continue;
        unsigned d = differ(&b, m);
        if (!best || popcount(d) < popcount(best_d)) best = *n, best_d = d;
    }
    char tmp[SPEC_MAX + 200]; /* every override at its longest fits */
    int len = snprintf(tmp, sizeof tmp, "%s", best ? best : "fp16");
    if (m->fp16) {
        if (best_d & SET_GROUP) len += snprintf(tmp + len, sizeof tmp - len, ":group=%d",
                                                m->group);
    } else {
        if (best_d & SET_ALPHA) len += snprintf(tmp + len, sizeof tmp - len, ":alpha=%.9g",
                                                (double)m->alpha);
        if (best_d & SET_SELECT) len += snprintf(tmp + len, sizeof tmp - len, ":select=%s",
                                                 select_name(m->select));
        if (best_d & SET_SEED) len += snprintf(tmp + len, sizeof tmp - len, ":seed=%llu",
                                               (unsigned long long)m->seed);
        if (best_d & SET_SINK) len += snprintf(tmp + len, sizeof tmp - len, ":sink=%d", m->sink);
        if (best_d & SET_GROUP) len += snprintf(tmp + len, sizeof tmp - len, ":group=%d",
                                                m->group);
        if (best_d & SET_WINDOW) len += snprintf(tmp + len, sizeof tmp - len, ":window=%d",
                                                 m->window);
        if (best_d & SET_VBITS) len += snprintf(tmp + len, sizeof tmp - len, ":vbits=%d",
                                                m->value_bits);
        if (best_d & SET_EAGER) len += snprintf(tmp + len, sizeof tmp - len, ":eager=%d",
                                                m->eager_values);
        if (best_d & SET_PAIRS) len += snprintf(tmp + len, sizeof tmp - len, ":pairs=%d",
                                                m->pairs);
        if (best_d & SET_ROT) len += snprintf(tmp + len, sizeof tmp - len, ":rot=%s",
                                              rot_name(m->key_rot));
        if (best_d & SET_VROT) len += snprintf(tmp + len, sizeof tmp - len, ":vrot=%s",
                                               rot_name(m->value_rot));
        if (best_d & SET_CLIP) len += snprintf(tmp + len, sizeof tmp - len, ":clip=%d",
                                               m->clip);
        if (best_d & SET_VCLIP) len += snprintf(tmp + len, sizeof tmp - len, ":vclip=%d",
                                                m->value_clip);
        if (best_d & SET_BUDGET) len += snprintf(tmp + len, sizeof tmp - len, ":budget=%s",
                                                 budget_name(m->budget));
        if (best_d & SET_SINK8) len += snprintf(tmp + len, sizeof tmp - len, ":sink8=%d",
                                                m->sink_int8);
        if (best_d & SET_WIN8) len += snprintf(tmp + len, sizeof tmp - len, ":win8=%d",
                                               m->window_int8);
        if (best_d & SET_KBITS) len += snprintf(tmp + len, sizeof tmp - len, ":kbits=%d",
                                                m->key_bits == 8 ? 8 : 2);
    }
    if (n_out) *n_out = (size_t)len;
    if ((size_t)len + 1 > cap)
        return kkv_fail(KKV_ERR_INVALID_ARG, "method format: %d bytes needed, %zu given",
                        len + 1, cap);
    memcpy(buf, tmp, (size_t)len + 1);
    return KKV_OK;
}
