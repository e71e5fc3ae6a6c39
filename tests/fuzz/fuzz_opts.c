/* libFuzzer target for the CLI's option parser (tools/kittykv/opts.c, compiled
 * in directly): the input, split at NUL bytes, is an argv; it is parsed
 * against a table holding every option kind, aliases and short names, and the
 * parser's promises are checked: a status of OK, HELP or ERROR; on ERROR one
 * non-empty line naming the command; on OK every number inside its range and
 * every string pointing into argv. --help is generated too (to /dev/null).
 * Build: CC=clang cmake -DKKV_FUZZ=ON; run: fuzz_opts tests/fuzz/corpus_opts
 * (tests/fuzz/replay.c runs the corpus through it in every build). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../tools/kittykv/opts.c"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int in_args(const char *p, char *const *argv, int argc) {
    for (int i = 0; i < argc; i++)
        if (p >= argv[i] && p <= argv[i] + strlen(argv[i])) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    char buf[4096 + 1];
    if (size > sizeof buf - 1) size = sizeof buf - 1;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = "fuzz";
    for (size_t i = 0; i <= size && argc < MAX_ARGS;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;

    int flag = 0, i_val = -7, given = 0;
    uint64_t u = 99;
    float f = -3.0f;
    const char *str = NULL, *list = NULL, *spec = NULL;
    const opt_def defs[] = {
        {'x', "flag", OPT_FLAG, 0, 0, &flag, NULL, NULL, "a flag"},
        {'n', "n-predict|count", OPT_INT, -5, 1000, &i_val, &given, "N", "an int\nsecond line"},
        {'s', "seed", OPT_U64, 0, 2147483647, &u, NULL, "S", "a seed"},
        {0, "temp", OPT_FLOAT, 0, 2, &f, NULL, "T", "a float"},
        {'p', "prompt", OPT_STRING, 0, 0, &str, NULL, "TEXT", "a string"},
        {0, "kv|methods", OPT_LIST, 0, 0, &list, NULL, "LIST", "a list"},
        {0, "method", OPT_SPEC, 0, 0, &spec, NULL, "SPEC", "a spec"},
        {0, "hidden", OPT_STRING, 0, 0, &str, NULL, "X", NULL},
    };
    char err[256];
    memset(err, 'Z', sizeof err);
    int rc = opts_parse("fuzz", defs, OPTS_N(defs), argc, argv, err, sizeof err);
    if (rc == OPTS_ERROR) {
        size_t len = 0;
        while (len < sizeof err && err[len]) len++;
        if (len == sizeof err || len == 0 || strchr(err, '\n') || strncmp(err, "kittykv fuzz", 12))
            __builtin_trap();
    } else if (rc == OPTS_OK) {
        if (i_val != -7 && (i_val < -5 || i_val > 1000)) __builtin_trap();
        if (given && i_val == -7) __builtin_trap();
        if (u != 99 && u > 2147483647u) __builtin_trap();
        if (f != -3.0f && !(f >= 0.0f && f <= 2.0f)) __builtin_trap();
        if (flag != 0 && flag != 1) __builtin_trap();
        if (str && !in_args(str, argv, argc)) __builtin_trap();
        if (list && (!in_args(list, argv, argc) || !*list || strstr(list, ",,")))
            __builtin_trap();
        if (spec) {
            kkv_method m;
            if (!in_args(spec, argv, argc) || kkv_method_parse(&m, spec) != KKV_OK)
                __builtin_trap();
        }
    } else if (rc == OPTS_HELP) {
        if (devnull) opts_help(devnull, "fuzz", NULL, defs, OPTS_N(defs), "epilog\n");
    } else {
        __builtin_trap();
    }
    return 0;
}
