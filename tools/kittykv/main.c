/* kittykv: command-line front end. Dispatches to cli/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"generate", cmd_generate, "generate text with a GGUF model on a quantized KV cache"},
    {"chat", cmd_chat, "multi-turn chat on stdin, the conversation kept in the cache"},
    {"eval", cmd_eval, "KL divergence / perplexity / top-1 of every method vs fp16"},
    {"passkey", cmd_passkey, "passkey retrieval accuracy per method, length and depth"},
    {"analyze", cmd_analyze, "channel sensitivity, heatmaps, ablations (CSV/JSON/PNG)"},
    {"bench", cmd_bench, "attention / decode / flush / serving benchmarks"},
    {"quantize", cmd_quantize, "push dumped K/V through a method, see what attention sees"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server, continuous batching on one KV pool"},
};

static void usage(FILE *f) {
    fprintf(f, "kittykv %d.%d.%d -- 2-bit KV cache with channel-wise precision boost\n\n",
            KKV_VERSION_MAJOR, KKV_VERSION_MINOR, KKV_VERSION_PATCH);
    fprintf(f, "usage: kittykv COMMAND [options]   (kittykv COMMAND --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nmethods:");
    for (const char *const *n = kkv_method_names(); *n; n++) fprintf(f, " %s", *n);
    fprintf(f, "\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kittykv %d.%d.%d\n", KKV_VERSION_MAJOR, KKV_VERSION_MINOR, KKV_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kittykv: unknown command '%s' (kittykv --help lists them)\n", argv[1]);
    return 2;
}
