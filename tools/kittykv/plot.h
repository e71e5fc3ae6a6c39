/* PNG plots through gnuplot (run as a child process): the CLI never encodes
 * images itself. */
#ifndef KKV_CLI_PLOT_H
#define KKV_CLI_PLOT_H

/* Renders a gnuplot script body to a PNG of width x height pixels at png.
 * The terminal (pngcairo, else png) and output are set here; body holds the
 * plot commands. Returns 0 on success; 1 if gnuplot is missing or failed
 * (a one-line reason printed on stderr prefixed with who). */
int plot_png(const char *who, const char *png, int width, int height, const char *body);

/* 1 if the path can be quoted inside a gnuplot single-quoted string. */
int plot_path_ok(const char *path);

#endif
