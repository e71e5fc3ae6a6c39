/* kkv_big_alloc: anonymous mappings advised as huge-page candidates on Linux,
 * aligned heap blocks elsewhere (core/bigmem.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include "core/bigmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(KKV_BIG_ASAN)

static size_t round_big(size_t bytes) {
    return (bytes + KKV_BIG_ALIGN - 1) & ~(KKV_BIG_ALIGN - 1);
}

/* KKV_HUGEPAGES=0: no advice (the OS's default page size, as before) for a
 * machine where THP compaction stalls or memory granularity matter more. */
static int advise_huge(void) {
    const char *e = getenv("KKV_HUGEPAGES");
    return !(e && strcmp(e, "0") == 0);
}

void *kkv_big_alloc(size_t bytes) {
    if (bytes == 0 || bytes > SIZE_MAX / 2) return NULL;
    size_t len = round_big(bytes);
    /* over-map by one granule, then unmap the misaligned head and the tail:
     * THP backs only 2 MiB-aligned ranges */
    size_t span = len + KKV_BIG_ALIGN;
    uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uintptr_t a = ((uintptr_t)raw + KKV_BIG_ALIGN - 1) & ~(uintptr_t)(KKV_BIG_ALIGN - 1);
    uint8_t *p = (uint8_t *)a;
    size_t head = (size_t)(p - raw), tail = span - head - len;
    if (head) munmap(raw, head);
    if (tail) munmap(p + len, tail);
    /* advice only: a kernel built without THP says EINVAL and the block
     * still works with small pages */
    if (advise_huge()) (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

void kkv_big_free(void *p, size_t bytes) {
    if (p) munmap(p, round_big(bytes));
}

#else

void *kkv_big_alloc(size_t bytes) {
    if (bytes == 0 || bytes > SIZE_MAX / 2) return NULL;
    size_t len = (bytes + 63) & ~(size_t)63; /* aligned_alloc wants a multiple */
    void *p = aligned_alloc(64, len);
    if (p) memset(p, 0, len);
    return p;
}

void kkv_big_free(void *p, size_t bytes) {
    (void)bytes;
    free(p);
}

#endif
