/* Helpers shared by the CLI subcommands: argument parsing, files, progress
 * on stderr, JSON strings. */
#ifndef KKV_CLI_UTIL_H
#define KKV_CLI_UTIL_H

#include <stddef.h>
#include <stdio.h>

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
 * NUL-terminated buffer; *len = bytes. At most KKV_TEXT_MAX_BYTES, so
 * /dev/zero or a huge file fails fast. NULL on failure, with a one-line reason
 * (naming the path) in kkv_last_error(). */
char *cli_read_file(const char *path, size_t *len);

/* Progress bar on stderr with rate and ETA; only when stderr is a terminal or
 * KKV_PROGRESS=1. Call with done == total to finish the line. */
void cli_progress(const char *label, long done, long total, double elapsed_s);

/* Seconds from a monotonic clock. */
double cli_now(void);

/* Writes s as a JSON string literal (quotes, escapes). */
void cli_json_str(FILE *f, const char *s);

#endif
