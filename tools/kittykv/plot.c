#include "plot.h"

#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

int plot_path_ok(const char *path) {
    return path && !strpbrk(path, "'\n\r");
}

/* Runs gnuplot with one script; 0 when it exits 0. */
static int run_gnuplot(const char *term, const char *png, int width, int height,
                       const char *body, int quiet) {
    /* the first try may fail only for want of pngcairo: keep it quiet */
    FILE *gp = popen(quiet ? "gnuplot 2>/dev/null" : "gnuplot", "w");
    if (!gp) return -1;
    /* a gnuplot that is missing or dies early must not kill us with SIGPIPE */
    struct sigaction ign, old;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    fprintf(gp, "set terminal %s size %d,%d\nset output '%s'\n%s\nunset output\n", term, width,
            height, png, body);
    int st = pclose(gp);
    sigaction(SIGPIPE, &old, NULL);
    return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int plot_png(const char *who, const char *png, int width, int height, const char *body) {
    if (!plot_path_ok(png)) {
        fprintf(stderr, "kittykv %s: cannot plot to '%s' (quote or newline in the path)\n", who,
                png);
        return 1;
    }
    if (run_gnuplot("pngcairo", png, width, height, body, 1) == 0) return 0;
    if (run_gnuplot("png", png, width, height, body, 0) == 0) return 0;
    fprintf(stderr, "kittykv %s: gnuplot failed or is not installed: %s not written\n", who, png);
    remove(png);
    return 1;
}
