/* The data behind `kittykv analyze pareto`: points of (bits/element, KL),
 * the Pareto frontier over kittykv's own points, the external points file
 * (another tool's measurements, e.g. llama.cpp's quantized KV) and a saved
 * `kittykv eval --json` result. No model, no I/O beyond reading one file, so
 * the tests can drive it without a model. */
#ifndef KKV_CLI_PARETO_H
#define KKV_CLI_PARETO_H

#include <stddef.h>

#define PARETO_MAX_POINTS 64
#define PARETO_LABEL 128

typedef struct pareto_pt {
    char   label[PARETO_LABEL]; /* method spec, or the external file's label  */
    double bits;                /* bits per K/V element, every stored byte     */
    double kld_mean;            /* KL(p_fp16 || p_method), nats               */
    double kld_p99, ppl, dppl_pct, top1; /* NAN where the source has none      */
    int    external;            /* 1: read from --points, not measured here    */
    int    frontier;            /* set by pareto_frontier                      */
} pareto_pt;

/* Marks frontier = 1 on every kittykv (non-external) point that no other
 * kittykv point dominates (bits <= and KL <=, one of them strictly), 0 on
 * the rest (external points are never on it). Returns how many are on it. */
int pareto_frontier(pareto_pt *p, int n);

/* The kittykv point of lowest KL among those with bits <= max_bits (+1e-9),
 * ties to fewer bits; -1 if there is none. */
int pareto_best_within(const pareto_pt *p, int n, double max_bits);

/* Reads external points from a CSV file, one per line:
 *     label,bits_per_element,kld_mean[,kld_p99[,top1[,ppl]]]
 * '#' starts a comment line, blank lines are skipped, and a first data line whose
 * second field is not a number is a header. Labels may not hold commas or
 * double quotes. out: [cap], filled with external = 1. Returns the count, or
 * -1 with a one-line reason naming the file and line in err. */
int pareto_read_points(pareto_pt *out, int cap, const char *path, char *err, size_t errlen);

/* What a saved `kittykv eval --json` run holds beside its methods. */
typedef struct pareto_run {
    int    tokens, score_from;
    long   scored;
    double fp16_ppl;
    char   text[512];           /* the evaluated text's path as eval printed it */
} pareto_run;

/* Reads the JSON object `kittykv eval --json` prints (the last line of the
 * file that starts with '{', so a saved stdout with its table works too) into
 * run and out [cap] (external = 0). Returns the count of methods, or -1 with
 * a one-line reason in err. */
int pareto_read_eval_json(pareto_run *run, pareto_pt *out, int cap, const char *path, char *err,
                          size_t errlen);

#endif
