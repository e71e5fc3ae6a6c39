/* One table-driven option parser for every kittykv subcommand: each command
 * describes its options in a table of opt_def (names, kind, range, target,
 * help) and gets parsing, range checks, one-line errors and --help from it.
 * The parser never prints while parsing: it fills an error buffer, so the
 * fuzzer (tests/fuzz/fuzz_opts.c) can run it quietly. */
#ifndef KKV_CLI_OPTS_H
#define KKV_CLI_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum opt_kind {
    OPT_FLAG   = 1, /* int *: set to 1; takes no value                      */
    OPT_INT    = 2, /* int *: a decimal integer in [lo, hi]                 */
    OPT_U64    = 3, /* uint64_t *: a decimal integer >= 0, <= hi            */
    OPT_FLOAT  = 4, /* float *: a finite number in [lo, hi]                 */
    OPT_STRING = 5, /* const char **: the argument as given (borrowed argv) */
    OPT_LIST   = 6, /* const char **: comma-separated, no empty entry       */
    OPT_SPEC   = 7, /* const char **: one method spec (kkv_method_parse)    */
} opt_kind;

typedef struct opt_def {
    char        short_name; /* 'm' for -m; 0: none                           */
    const char *names;      /* long names without "--", '|'-separated; the
                               first is the documented one, the rest aliases
                               ("ctx-size|ctx"); NULL: short only            */
    opt_kind    kind;
    double      lo, hi;     /* range of OPT_INT / OPT_U64 / OPT_FLOAT        */
    void       *target;     /* where the value goes, by kind (see above)     */
    int        *given;      /* set to 1 when the option appears; may be NULL */
    const char *metavar;    /* shown in --help: "N", "SPEC", "FILE"          */
    const char *help;       /* NULL: left out of --help (options for tests);
                               '\n' starts an indented continuation line    */
} opt_def;

enum { OPTS_OK = 0, OPTS_HELP = 1, OPTS_ERROR = 2 };

/* Parses argv[1..argc) (argv[0] is the command's name) against defs [n]:
 * "--name value", "--name=value", "-x value", "-xvalue"; the last occurrence
 * wins; "-h"/"--help" anywhere returns OPTS_HELP. Positional arguments are
 * errors. On OPTS_ERROR err [errlen] holds one line, "kittykv CMD: ..." naming
 * the option. Targets of options seen before an error may have been written;
 * nothing else is touched. */
int opts_parse(const char *cmd, const opt_def *defs, int n, int argc, char *const *argv,
               char *err, size_t errlen);

/* Writes "usage: kittykv CMD SYNOPSIS", the options table generated from defs
 * (hidden ones left out), and epilog (may be NULL) to f. */
void opts_help(FILE *f, const char *cmd, const char *synopsis, const opt_def *defs, int n,
               const char *epilog);

/* Only the options table of opts_help (for commands that write their own
 * usage line and description first). */
void opts_help_options(FILE *f, const opt_def *defs, int n);

/* opts_parse, then: --help printed on stdout (returns -1), an error printed
 * on stderr (returns 2), or 0 to run. The convenience every command uses. */
int opts_run(const char *cmd, const char *synopsis, const opt_def *defs, int n,
             const char *epilog, int argc, char *const *argv);

#define OPTS_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
