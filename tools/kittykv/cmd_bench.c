/* kittykv bench: speed benchmarks (attention, decode, flush, serve). Each
 * subcommand lives in cli/bench_<name>.c and shares cli/bench_util.c. They
 * print tables on stdout and, with --json, one JSON object on the last line;
 * progress goes to stderr. Every figure is a ratio or a measurement taken in
 * the same run, as medians of interleaved repetitions. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cmd.h"

typedef struct sub {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} sub;

static const sub subs[] = {
    {"attention", bench_attention, "decode attention per token vs context, and the roofline"},
    {"decode", bench_decode, "end-to-end decode tokens/s per method at context depths"},
    {"flush", bench_flush, "page flush cost, its share of decode, latency p50/p99"},
    {"serve", bench_serve, "sequences that fit a KV budget, and their aggregate tokens/s"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kittykv bench SUBCOMMAND [options]   (kittykv bench SUBCOMMAND --help)\n"
               "\nsubcommands:\n");
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        fprintf(f, "  %-10s %s\n", subs[i].name, subs[i].help);
    fprintf(f, "\nAll print a table; --json adds one JSON object on the last line.\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        if (!strcmp(argv[1], subs[i].name)) return subs[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kittykv bench: unknown subcommand '%s' (kittykv bench --help)\n", argv[1]);
    return 2;
}
