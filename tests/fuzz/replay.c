/* Runs every file of the corpus folders given on the command line through
 * LLVMFuzzerTestOneInput once: the seed corpus becomes a regression test in
 * builds without libFuzzer (gcc, sanitizers). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    int n = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) {
            fprintf(stderr, "replay: cannot open %s\n", argv[a]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            static uint8_t buf[1 << 20]; /* [1 MiB] one input */
            size_t len = fread(buf, 1, sizeof buf, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, len);
            n++;
        }
        closedir(d);
    }
    printf("replay: %d inputs, no crash\n", n);
    return n ? 0 : 1;
}
