/* kittykv quantize: push dumped keys/values of one head through a method's
 * token lifecycle and write what attention would see. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"
#include "tensorio.h"
#include "opts.h"
#include "util.h"

static const char *const SYNOPSIS =
    "--kv SPEC --head-dim D --keys FILE [--values FILE] [options]";
static const char *const EPILOG =
    "FILE: raw little-endian float32 [tokens][head_dim], or a 2-D float32 .npy.\n"
    "Tokens go through one sequence/layer/head one at a time; outputs hold the\n"
    "keys/values as attention sees them after the last step (.npy if the name ends\n"
    "in .npy). --out-pages writes every key page, in order, in the page format of\n"
    "kittykv.h (quantized methods only). Without --values, values are left out of\n"
    "every figure. --alpha, --select, --seed, --sink, --group and --window are the\n"
    "spec's keys of the same names: an option the method ignores is an error.\n";

static double rel_err(const float *x, const float *y, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        num += d * d;
        den += (double)x[i] * (double)x[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Concatenates the key pages of head 0 in the public page format. */
static int write_pages(const char *path, const kkv_cache *c, int seq, int fp16) {
    if (fp16) {
        fprintf(stderr, "kittykv quantize: --out-pages: the fp16 method has no quantized pages\n");
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    const kkv_cache_config *cfg = kkv_cache_get_config(c);
    kkv_seq_info si;
    kkv_seq_get_info(c, &si, seq, 0);
    /* budget=head|err: a page has its own n_boost, up to head_dim */
    size_t cap = kkv_method_key_page_bytes(&cfg->method, cfg->head_dim, cfg->head_dim);
    uint8_t *buf = malloc(cap); /* one key page */
    int bad = !buf;
    for (int p = 0; !bad && p < si.key_pages; p++) {
        size_t bytes = kkv_method_key_page_bytes(&cfg->method, cfg->head_dim,
                                                 kkv_seq_key_page_boost(c, seq, 0, 0, p));
        bad = kkv_seq_key_page(c, buf, cap, seq, 0, 0, p) != KKV_OK;
        bad = bad || fwrite(buf, 1, bytes, f) != bytes;
    }
    free(buf);
    bad |= fclose(f) != 0;
    if (bad) fprintf(stderr, "kittykv quantize: %s: write failed\n", path);
    return bad ? -1 : 0;
}

/* Appends ":key=value" to spec [cap]; -1 if it does not fit. */
static int spec_add(char *spec, size_t cap, const char *key, const char *value) {
    size_t len = strlen(spec);
    int n = snprintf(spec + len, cap - len, ":%s=%s", key, value);
    return n < 0 || (size_t)n >= cap - len ? -1 : 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *method_name = NULL, *keys_path = NULL, *values_path = NULL;
    const char *out_keys = NULL, *out_values = NULL, *select = NULL, *out_pages = NULL;
    const char *seed = NULL, *sink = NULL, *group = NULL, *window = NULL;
    int D = 0, json = 0, have_alpha = 0;
    float alpha = 0;
    const opt_def defs[] = {
        {0, "kv|method", OPT_SPEC, 0, 0, &method_name, NULL, "SPEC",
         "method spec (kittykv eval --help), e.g. kitty or kitty:alpha=0.25"},
        {0, "head-dim", OPT_INT, 1, 1 << 20, &D, NULL, "D", "channels per token"},
        {0, "keys", OPT_STRING, 0, 0, &keys_path, NULL, "FILE", "keys [tokens][D]"},
        {0, "values", OPT_STRING, 0, 0, &values_path, NULL, "FILE", "values [tokens][D]"},
        {0, "alpha", OPT_FLOAT, 0, 1, &alpha, &have_alpha, "A", "boost fraction (spec alpha=A)"},
        {0, "select", OPT_STRING, 0, 0, &select, NULL, "S",
         "magnitude|variance|random (spec select=S)"},
        {'s', "seed", OPT_STRING, 0, 0, &seed, NULL, "N", "seed of select=random (spec seed=N)"},
        {0, "sink", OPT_STRING, 0, 0, &sink, NULL, "N", "fp16 sink tokens (spec sink=N)"},
        {0, "group", OPT_STRING, 0, 0, &group, NULL, "G", "page size in tokens (spec group=G)"},
        {0, "window", OPT_STRING, 0, 0, &window, NULL, "R",
         "recent fp16 values (spec window=R)"},
        {0, "out-keys", OPT_STRING, 0, 0, &out_keys, NULL, "FILE", "write the keys as seen"},
        {0, "out-values", OPT_STRING, 0, 0, &out_values, NULL, "FILE",
         "write the values as seen (needs --values)"},
        {0, "out-pages", OPT_STRING, 0, 0, &out_pages, NULL, "FILE", "write the key pages"},
        {0, "json", OPT_FLAG, 0, 0, &json, NULL, NULL, "print one JSON object"},
    };
    int rc0 = opts_run("quantize", SYNOPSIS, defs, OPTS_N(defs), EPILOG, argc, argv);
    if (rc0) return rc0 < 0 ? 0 : rc0;
    if (!method_name || !keys_path || !D) {
        fprintf(stderr, "kittykv quantize: --kv (or --method), --head-dim and --keys are "
                "required (see --help)\n");
        return 2;
    }
    if (out_values && !values_path) {
        fprintf(stderr, "kittykv quantize: --out-values needs --values\n");
        return 2;
    }
    /* The options become the spec's keys, so the spec parser's rules hold
     * for them too: a key the method ignores, or one given twice, is an
     * error. */
    char spec[256], num[32];
    snprintf(num, sizeof num, "%.9g", (double)alpha);
    int too_long = snprintf(spec, sizeof spec, "%s", method_name) >= (int)sizeof spec;
    too_long = too_long || (have_alpha && spec_add(spec, sizeof spec, "alpha", num));
    too_long = too_long || (select && spec_add(spec, sizeof spec, "select", select));
    too_long = too_long || (seed && spec_add(spec, sizeof spec, "seed", seed));
    too_long = too_long || (sink && spec_add(spec, sizeof spec, "sink", sink));
    too_long = too_long || (group && spec_add(spec, sizeof spec, "group", group));
    too_long = too_long || (window && spec_add(spec, sizeof spec, "window", window));
    kkv_method m;
    if (too_long) {
        fprintf(stderr, "kittykv quantize: method spec too long\n");
        return 2;
    }
    if (kkv_method_parse(&m, spec) != KKV_OK) {
        fprintf(stderr, "kittykv quantize: %s\n", kkv_last_error());
        return 2;
    }
    if (m.select == KKV_SELECT_EXPLICIT) {
        fprintf(stderr, "kittykv quantize: select=oracle needs channel rankings; only "
                "`kittykv analyze ablation` computes them\n");
        return 2;
    }
    if (kkv_method_check(&m, D) != KKV_OK) {
        fprintf(stderr, "kittykv quantize: %s\n", kkv_last_error());
        return 2;
    }

    char err[512];
    long T = 0, Tv = 0;
    float *keys = tio_read(keys_path, D, &T, err, sizeof err); /* [T][D] */
    if (!keys) {
        fprintf(stderr, "kittykv quantize: %s\n", err);
        return 1;
    }
    float *values = NULL; /* [T][D] */
    if (values_path) {
        values = tio_read(values_path, D, &Tv, err, sizeof err);
        if (!values || Tv != T) {
            if (values) snprintf(err, sizeof err, "%s has %ld tokens, keys have %ld", values_path, Tv, T);
            fprintf(stderr, "kittykv quantize: %s\n", err);
            free(keys);
            free(values);
            return 1;
        }
    }
    if (T == 0) {
        fprintf(stderr, "kittykv quantize: %s holds no tokens\n", keys_path);
        free(keys);
        free(values);
        return 1;
    }

    int rc = 1;
    kkv_cache *c = NULL;
    float *zero = calloc((size_t)D, sizeof *zero);                 /* [D] */
    float *ko = malloc((size_t)T * D * sizeof *ko);                /* [T][D] */
    float *vo = values ? malloc((size_t)T * D * sizeof *vo) : NULL; /* [T][D] */
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = D, .method = m};
    /* room for every page of T tokens plus the staging area */
    size_t page = 4 * (size_t)m.group * D + 8 * (size_t)D + 8 * (size_t)m.group; /* >= any method's */
    cfg.pool_bytes = ((size_t)T / m.group + 2) * page +
                     ((size_t)2 * m.sink + 2 * m.group + m.window) * D * 2;
    int seq = 0;
    kkv_status st = !zero || !ko || (values && !vo) ? KKV_ERR_NOMEM : KKV_OK;
    if (st == KKV_OK) st = kkv_cache_create(&c, &cfg);
    if (st == KKV_OK) st = kkv_seq_add(c, &seq);
    for (long t = 0; t < T && st == KKV_OK; t++) {
        st = kkv_append(c, seq, 0, keys + t * D, values ? values + t * D : zero);
        if (st == KKV_OK) st = kkv_flush(c, seq, 0);
    }
    if (st == KKV_OK) st = kkv_seq_read(c, ko, vo, seq, 0, 0);
    if (st != KKV_OK) {
        fprintf(stderr, "kittykv quantize: %s\n",
                st == KKV_ERR_NOMEM ? "out of memory" : kkv_last_error());
        goto done;
    }

    kkv_mem mem;
    kkv_seq_mem(c, &mem, seq);
    if (!values) {
        /* keys alone: drop value pages and the fp16 values from the figures */
        kkv_seq_info n;
        kkv_seq_get_info(c, &n, seq, 0);
        int sink8 = !m.fp16 && m.sink_int8; /* int8 sink rows: D codes + a scale */
        uint64_t fp16_keys = (uint64_t)((sink8 ? 0 : n.sink) + n.key_buffer) * D * 2;
        if (m.fp16) fp16_keys += (uint64_t)n.key_pages * m.group * D * 2;
        mem.fp16 = fp16_keys;
        mem.sink_int8 = sink8 ? (uint64_t)n.sink * (D + 2) : 0;
        mem.value_codes = mem.value_meta = 0;
        mem.total = mem.key_lo + mem.key_hi + mem.key_idx + mem.key_meta + mem.fp16 +
                    mem.sink_int8;
    }
    double elems = (double)T * D * (values ? 2 : 1);
    double bpe = 8.0 * (double)mem.total / elems;
    double kerr = rel_err(keys, ko, (size_t)T * D);
    double verr = values ? rel_err(values, vo, (size_t)T * D) : 0.0;

    if (out_keys && tio_write(out_keys, ko, T, D, err, sizeof err)) {
        fprintf(stderr, "kittykv quantize: %s\n", err);
        goto done;
    }
    if (out_values && tio_write(out_values, vo, T, D, err, sizeof err)) {
        fprintf(stderr, "kittykv quantize: %s\n", err);
        goto done;
    }

    if (out_pages && write_pages(out_pages, c, seq, m.fp16)) goto done;

    if (!json) {
        printf("method %s  tokens %ld  head_dim %d  boosted channels %d of %d\n", method_name,
               T, D, kkv_method_boost(&m, D), D);
        printf("%-12s %12s\n", "component", "bytes");
        printf("%-12s %12llu\n", "key_lo", (unsigned long long)mem.key_lo);
        printf("%-12s %12llu\n", "key_hi", (unsigned long long)mem.key_hi);
        printf("%-12s %12llu\n", "key_idx", (unsigned long long)mem.key_idx);
        printf("%-12s %12llu\n", "key_meta", (unsigned long long)mem.key_meta);
        if (values) {
            printf("%-12s %12llu\n", "value_codes", (unsigned long long)mem.value_codes);
            printf("%-12s %12llu\n", "value_meta", (unsigned long long)mem.value_meta);
        }
        printf("%-12s %12llu\n", "fp16", (unsigned long long)mem.fp16);
        if (mem.sink_int8) printf("%-12s %12llu\n", "sink_int8", (unsigned long long)mem.sink_int8);
        printf("%-12s %12llu\n", "total", (unsigned long long)mem.total);
        printf("bits/element %.4f   key rel err %.5f", bpe, kerr);
        if (values) printf("   value rel err %.5f", verr);
        printf("\n");
    } else {
        printf("{\"method\":");
        cli_json_str(stdout, method_name);
        printf(",\"tokens\":%ld,\"head_dim\":%d,\"alpha\":%.6g,\"n_boost\":%d,\"values\":%s,"
               "\"bytes\":{\"key_lo\":%llu,\"key_hi\":%llu,\"key_idx\":%llu,\"key_meta\":%llu,"
               "\"value_codes\":%llu,\"value_meta\":%llu,\"fp16\":%llu,\"sink_int8\":%llu,"
               "\"total\":%llu},\"bits_per_element\":%.6f,\"key_rel_err\":%.8g,\"value_rel_err\":",
               T, D, (double)m.alpha, kkv_method_boost(&m, D), values ? "true" : "false",
               (unsigned long long)mem.key_lo, (unsigned long long)mem.key_hi,
               (unsigned long long)mem.key_idx, (unsigned long long)mem.key_meta,
               (unsigned long long)mem.value_codes, (unsigned long long)mem.value_meta,
               (unsigned long long)mem.fp16, (unsigned long long)mem.sink_int8,
               (unsigned long long)mem.total, bpe, kerr);
        if (values) printf("%.8g}\n", verr);
        else printf("null}\n");
    }
    rc = 0;
done:
    kkv_cache_free(c);
    free(zero);
    free(ko);
    free(vo);
    free(keys);
    free(values);
    return rc;
}
