/* Method specs: every named method parses to kkv_method_from_name's value,
 * kkv_method_format is canonical and round-trips, and specs that set what the
 * method would ignore are rejected with a one-line message. The one RNG and
 * kkv_argmax are checked here too (small public helpers of the core and model
 * layers). */
#include <string.h>

#include "kittykv.h"
#include "kittykv_model.h"
#include "testutil.h"

static int same(const kkv_method *a, const kkv_method *b) {
    return a->fp16 == b->fp16 && a->sink == b->sink && a->group == b->group &&
           a->window == b->window && a->alpha == b->alpha && a->value_bits == b->value_bits &&
           a->select == b->select && a->seed == b->seed && a->eager_values == b->eager_values &&
           a->pairs == b->pairs && a->key_rot == b->key_rot && a->value_rot == b->value_rot &&
           a->clip == b->clip && a->value_clip == b->value_clip && a->budget == b->budget &&
           a->sink_int8 == b->sink_int8 && a->window_int8 == b->window_int8 &&
           a->key_bits == b->key_bits;
}

static void test_names(void) {
    for (const char *const *n = kkv_method_names(); *n; n++) {
        kkv_method a, b;
        CHECK(kkv_method_from_name(&a, *n) == KKV_OK, "%s: from_name", *n);
        CHECK(kkv_method_parse(&b, *n) == KKV_OK, "%s: parse: %s", *n, kkv_last_error());
        CHECK(same(&a, &b), "%s: parse differs from from_name", *n);
        char buf[256];
        size_t len = 0;
        CHECK(kkv_method_format(buf, sizeof buf, &len, &a) == KKV_OK && !strcmp(buf, *n) &&
                  len == strlen(*n),
              "%s: formats as '%s'", *n, buf);
    }
}

static void test_round_trip(void) {
    static const char *specs[] = {
        "kitty:alpha=0.5:select=random:seed=3", "kitty:select=variance", "kitty-pro:sink=0",
        "kivi-k2v2:group=64:window=32", "kivi-k4v2s:vbits=4", "kitty:alpha=0.1875",
        "fp16:group=64", "kitty:alpha=0:vbits=4", "kitty:select=oracle",
        "kivi-k2v2s:alpha=0.3333333",
        /* beyond the paper */
        "kitty:pairs=1", "kitty:select=range", "kitty:pairs=1:select=variance", "kitty:clip=1",
        "kitty:vclip=1", "kitty:rot=hadamard", "kitty:rot=random:seed=9", "kitty:vrot=random",
        "kivi-k2v2s:rot=hadamard:vrot=hadamard", "kitty-plus:pairs=0:clip=0",
        "kitty-plus-pro:alpha=0.5", "kitty-plus:eager=0", "kitty-pro:eager=1:pairs=1:clip=1:vclip=1",
        /* 8-bit codes */
        "kivi-k8v8:vbits=4", "kivi-k8v8:sink=32:window=128", "kivi-k8v8:rot=hadamard",
        "kivi-k4v4:vbits=8", "kitty:vbits=8", "kivi-k2v2:kbits=8:vbits=8:eager=1:window=0",
        "kivi-k8v8:kbits=2", "kivi-k8v8:eager=0:vrot=random",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kkv_method m, back;
        CHECK(kkv_method_parse(&m, specs[i]) == KKV_OK, "%s: %s", specs[i], kkv_last_error());
        char buf[256];
        CHECK(kkv_method_format(buf, sizeof buf, NULL, &m) == KKV_OK, "%s: format", specs[i]);
        CHECK(kkv_method_parse(&back, buf) == KKV_OK && same(&m, &back),
              "%s -> '%s' does not parse back to the same method", specs[i], buf);
    }
    kkv_method m;
    kkv_method_parse(&m, "kitty:alpha=0.5:select=random:seed=3");
    CHECK(m.alpha == 0.5f && m.select == KKV_SELECT_RANDOM && m.seed == 3 && m.sink == 32,
          "overrides not applied");
    char small[4];
    size_t need = 0;
    CHECK(kkv_method_format(small, sizeof small, &need, &m) == KKV_ERR_INVALID_ARG && need > 4,
          "a short buffer must fail and say the length needed (%zu)", need);
}

static void test_rejects(void) {
    static const char *bad[] = {
        "", "bogus", "kitty:", "kitty::alpha=0.5", "kitty:alpha", "kitty:=3", "kitty:alpha=2",
        "kitty:alpha=-0.1", "kitty:alpha=nan", "kitty:select=best", "kitty:nope=1",
        "fp16:seed=7", "fp16:alpha=0.5", "fp16:sink=4", "kivi-k2v2:select=random",
        "kivi-k4v4:select=variance", "kitty:seed=3", "kitty:alpha=0.5:alpha=0.25",
        "kitty:group=6", "kitty:group=8192", "kitty:vbits=3", "kitty:sink=-1",
        "kitty:seed=-1", "kitty:window=1e3",
        "kitty:pairs=2", "kitty:rot=fourier", "kitty:vrot=", "kitty:clip=yes",
        "kitty:pairs=1:rot=hadamard", "kitty-plus:rot=random", "kivi-k2v2:pairs=1",
        "fp16:rot=hadamard", "fp16:clip=1", "kitty:rot=hadamard:seed=1",
        "kitty:pairs=1:pairs=0",
        "kitty:kbits=8", "kitty:kbits=4", "kitty:vbits=6", "kivi-k8v8:alpha=0.5",
        "kivi-k8v8:clip=1", "kivi-k8v8:vclip=1", "kivi-k8v8:pairs=1", "kitty:vbits=8:vclip=1",
        "kivi-k8v8:kbits=8:kbits=2", "fp16:kbits=8",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kkv_method m;
        memset(&m, 0x5a, sizeof m);
        kkv_method before = m;
        kkv_status s = kkv_method_parse(&m, bad[i]);
        CHECK(s == KKV_ERR_INVALID_ARG || s == KKV_ERR_NOT_FOUND, "'%s' accepted", bad[i]);
        CHECK(!memcmp(&m, &before, sizeof m), "'%s': a failed parse changed *out", bad[i]);
        const char *e = kkv_last_error();
        CHECK(*e && !strchr(e, '\n'), "'%s': message must be one line: '%s'", bad[i], e);
    }
    char longspec[300];
    memset(longspec, 'a', sizeof longspec - 1);
    longspec[sizeof longspec - 1] = 0;
    kkv_method m;
    CHECK(kkv_method_parse(&m, longspec) == KKV_ERR_INVALID_ARG, "overlong spec accepted");
    CHECK(kkv_method_parse(NULL, "kitty") == KKV_ERR_INVALID_ARG, "NULL out");
    CHECK(kkv_method_parse(&m, NULL) == KKV_ERR_INVALID_ARG, "NULL spec");
}

/* kkv_method_check on structs no spec produces (the C API's callers fill
 * kkv_method themselves): each refused with its own one-line reason, while
 * the unchanged base passes, so the refusal is the changed field's. */
static void test_struct_rejects(void) {
    kkv_method kitty, k8;
    CHECK(kkv_method_parse(&kitty, "kitty") == KKV_OK && kkv_method_parse(&k8, "kivi-k8v8") == KKV_OK,
          "parse: %s", kkv_last_error());
    CHECK(kkv_method_check(&kitty, 64) == KKV_OK && kkv_method_check(&k8, 64) == KKV_OK,
          "bases: %s", kkv_last_error());
    const char *why[] = {"8-bit values have no range search", "pairs, clip and value_clip are 0 or 1",
                         "pairs, clip and value_clip are 0 or 1", "budget needs 0 < alpha < 1",
                         "budget needs 0 < alpha < 1", "budget needs 0 < alpha < 1",
                         "sink_int8 and window_int8 are 0 or 1", "sink_int8 and window_int8 are 0 or 1",
                         "unknown budget"};
    for (int i = 0; i < (int)(sizeof why / sizeof why[0]); i++) {
        kkv_method m = i == 0 ? k8 : kitty;
        switch (i) {
        case 0: m.value_clip = 1; break;
        case 1: m.pairs = 2; break;
        case 2: m.value_clip = -1; break;
        case 3: m.budget = KKV_BUDGET_HEAD, m.alpha = 1.0f; break;
        case 4: m.budget = KKV_BUDGET_ERR, m.select = KKV_SELECT_RANDOM; break;
        case 5: m.budget = KKV_BUDGET_HEAD, m.select = KKV_SELECT_EXPLICIT; break;
        case 6: m.sink_int8 = 2; break;
        case 7: m.window_int8 = 3; break;
        default: m.budget = (kkv_budget)(KKV_BUDGET_ERR + 1); break;
        }
        kkv_status st = kkv_method_check(&m, 64);
        const char *e = kkv_last_error();
        CHECK(st == KKV_ERR_INVALID_ARG && strstr(e, why[i]) && !strchr(e, '\n'),
              "case %d: status %d, '%s' (want '%s')", i, (int)st, e, why[i]);
    }
}

static void test_rng_argmax(void) {
    uint64_t a = 7, b = 7;
    for (int i = 0; i < 100; i++) CHECK(kkv_rng_next(&a) == kkv_rng_next(&b), "rng not pure");
    uint64_t s = 0;
    double lo = 1, hi = 0;
    for (int i = 0; i < 10000; i++) {
        double u = kkv_rng_uniform(&s);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    CHECK(lo >= 0.0 && lo < 0.01 && hi < 1.0 && hi > 0.99, "uniform range [%g, %g]", lo, hi);
    float x[] = {NAN, 1.0f, 3.0f, 3.0f, -INFINITY};
    CHECK(kkv_argmax(x, 5) == 2, "argmax: ties to the lower index, NaN never wins");
    float y[] = {NAN, NAN};
    CHECK(kkv_argmax(y, 2) == 0, "argmax of all-NaN is index 0");
}

int main(void) {
    test_names();
    test_round_trip();
    test_rejects();
    test_struct_rejects();
    test_rng_argmax();
    return tu_summary();
}
