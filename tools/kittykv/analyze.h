/* Shared state of the `kittykv analyze` subcommands (cli/analyze_*.c): the
 * options, the loaded model and tokens, and output-file helpers. */
#ifndef KKV_CLI_ANALYZE_H
#define KKV_CLI_ANALYZE_H

#include <stdint.h>
#include <stdio.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"

typedef struct an_opts {
    const char *sub;        /* subcommand name                               */
    const char *model, *text, *out;
    const char *method;     /* spec for stability / layers (default kitty);
                               pareto: its --kv LIST                          */
    int         kv_given;   /* --kv was given (pareto: else the default grid) */
    const char *points;     /* pareto: external points CSV, or NULL           */
    const char *from_eval;  /* pareto: saved `eval --json` files (comma list)   */
    int         json;       /* pareto: also print the JSON on stdout           */
    const char *alphas;     /* ablation: comma-separated alphas               */
    const char *selects;    /* ablation: comma-separated selections           */
    int         layer;      /* -1: the middle layer                          */
    int         ctx, score_from, chunk, threads, positions;
    int         calib_from; /* ablation: first token of the oracle's calibration
                               text (its --ctx tokens start there)           */
} an_opts;

typedef struct an_ctx {
    an_opts        o;
    kkv_model     *m;
    kkv_threadpool *tp;      /* the model's matmuls and the eval caches (ablation) */
    kkv_model_info info;
    int32_t       *tokens;   /* [n_tokens] the text, tokenized */
    int            n_tokens; /* >= o.ctx */
} an_ctx;

/* Subcommands: each returns an exit status (0 ok, 1 failure) and writes
 * CSV + JSON + PNG files under o.out. */
int an_heatmap(an_ctx *a);
int an_stability(an_ctx *a);
int an_ablation(an_ctx *a);
int an_layers(an_ctx *a);
int an_sensitivity(an_ctx *a);
int an_pareto(an_ctx *a);
/* pareto from saved `kittykv eval --json` runs (o.from_eval): needs no model,
 * a->m and a->tokens are unused. */
int an_pareto_saved(an_ctx *a);

/* Per-(layer, KV head) channel rankings by attention-score sensitivity (most
 * sensitive first), for select=oracle, measured over tokens
 * [o.calib_from, o.calib_from + o.ctx) of the text with an fp16 cache; also
 * writes <out>/oracle_ranks.csv. ranks: [n_layers][n_kv_heads][head_dim].
 * 0 on success; 1 after printing why they cannot be computed. */
int an_oracle_ranks(an_ctx *a, uint8_t *ranks);

/* "<out>/<name>" into buf [cap]; 0, or -1 if it does not fit. */
int an_path(char *buf, size_t cap, const an_ctx *a, const char *name);

/* Opens "<out>/<name>" for writing; NULL after printing why. */
FILE *an_open(const an_ctx *a, const char *name, char *path, size_t path_cap);

/* Closes f; 0, or 1 after printing a write error for path. */
int an_close(FILE *f, const char *path);

/* Runs tokens [0, n) of the text through the model into sequence seq of c
 * (no logits). 0, or 1 after printing why. */
int an_fill(an_ctx *a, kkv_cache *c, int seq, int n);

/* Prints the failing call's message and returns 1. */
int an_fail(const an_ctx *a, const char *what);

#endif
