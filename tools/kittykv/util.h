/* Helpers shared by the CLI subcommands: argument parsing, files, progress
 * on stderr, JSON strings. */
#ifndef KKV_CLI_UTIL_H
#define KKV_CLI_UTIL_H

#include <stddef.h>
#include <stdio.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"

/* A method spec as the user wrote it, and what kkv_method_parse made of it. */
typedef struct cli_spec {
    char       name[128]; /* the spec text as given (shown in tables)        */
    kkv_method method;
    int        is_ref;    /* exactly "fp16": reported from the reference run */
} cli_spec;

/* Parses one spec; 0, or -1 with kkv_method_parse's reason in err. */
int cli_spec_parse(cli_spec *out, const char *text, char *err, size_t errlen);
/* Parses a comma-separated list of specs into out [cap]: the count, or -1
 * with a reason in err (empty entries, duplicates, too many). */
int cli_spec_list(cli_spec *out, int cap, const char *list, char *err, size_t errlen);
/* The methods of a command's --kv LIST, or all ten named ones when list is
 * NULL; select=oracle is refused (only `analyze ablation` has rankings). The
 * count, or -1 after printing a usage error for cmd. */
int cli_spec_list_or_all(cli_spec *out, int cap, const char *list, const char *cmd);

/* models/SmolLM2-135M-Instruct.Q4_1.gguf under the source tree, or $KKV_MODEL. */
const char *cli_default_model(void);

/* Strict parses: the whole string must be a number in [lo, hi]. On failure
 * print "kittykv CMD: bad value for OPT: 'S'" and return -1. */
int cli_int(int *out, const char *s, long lo, long hi, const char *cmd, const char *opt);
int cli_float(float *out, const char *s, double lo, double hi, const char *cmd,
              const char *opt);
/* Comma-separated ints ("1024,4096"): out [cap]; returns count or -1. */
int cli_int_list(int *out, int cap, const char *s, const char *cmd, const char *opt);

/* A text input (prompt, evaluation text; "-" is not special) into a malloc'd
 * NUL-terminated buffer; *len = bytes. At most KKV_EVAL_MAX_TEXT_BYTES, so
 * /dev/zero or a huge file fails fast. NULL on failure, with a one-line reason
 * (naming the path) in kkv_last_error(). */
char *cli_read_file(const char *path, size_t *len);

/* Progress bar on stderr with rate and ETA; only when stderr is a terminal or
 * KKV_PROGRESS=1. Call with done == total to finish the line. */
void cli_progress(const char *label, long done, long total, double elapsed_s);

/* cli_progress as a kkv_eval_progress_fn; user is the label (const char *). */
void cli_progress_cb(void *user, long done, long total, double elapsed_s);

/* kkv_eval_run over parsed specs (their texts), progress on stderr as label. */
struct kkv_eval_result;
struct kkv_eval_config;
struct kkv_model;
int cli_eval_run(struct kkv_eval_result *res, struct kkv_eval_result *ref, struct kkv_model *m,
                 const int *tokens, struct kkv_eval_config *cfg, const cli_spec *specs,
                 int n_specs, const char *label, const char *cmd);

/* The most threads -t accepts: beyond it a pool only adds switching (issue 11:
 * -t 1000 on 2 cores ran 1,999 threads and was 100x slower). */
#define CLI_MAX_THREADS 256

/* The thread count to use for -t: requested (1..CLI_MAX_THREADS, or 0 when
 * -t was not given: every online core, at most CLI_MAX_THREADS). Warns on
 * stderr when the request exceeds the online cores. */
int cli_threads(int requested, const char *cmd);

/* Loads the model at path with its matmuls on tp (borrowed: free the model
 * first); the model gets no pool of its own. 0, or 1 after printing why. */
int cli_model_load(struct kkv_model **m, const char *path, kkv_threadpool *tp,
                   const char *cmd);

/* Seconds from a monotonic clock. */
double cli_now(void);

/* Writes s as a JSON string literal (quotes, escapes). */
void cli_json_str(FILE *f, const char *s);

#endif
