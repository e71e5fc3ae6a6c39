#include "core/cpu.h"

#include <stdlib.h>
#include <string.h>

/* KKV_CPU=scalar|avx2 caps the detected level, so one machine can exercise
 * every dispatch path (used by tests and benchmarks). */
const kkv_cpu *kkv_cpu_get(void) {
    static kkv_cpu cpu;
    static int done;
    if (done) return &cpu;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    cpu.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    cpu.avx512 = cpu.avx2 && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512dq");
    cpu.vnni = cpu.avx512 && __builtin_cpu_supports("avx512vnni");
#endif
    const char *cap = getenv("KKV_CPU");
    if (cap && strcmp(cap, "scalar") == 0) cpu.avx2 = cpu.avx512 = cpu.vnni = 0;
    if (cap && strcmp(cap, "avx2") == 0) cpu.avx512 = cpu.vnni = 0;
    done = 1;
    return &cpu;
}
