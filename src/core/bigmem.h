/* Memory for the library's large, long-lived arrays that every decode step
 * streams end to end: the page pool's slabs and the packed weights. Where the
 * OS offers transparent huge pages (Linux, THP "always" or "madvise"), the
 * region is 2 MiB-aligned and advised MADV_HUGEPAGE, so a step that walks
 * 100 MB takes ~50 TLB entries instead of ~25,000: on a Zen 3, fp16
 * attention at 16K 6-9% faster, kitty's 2-4%, decode at depth 0 ~4%
 * (docs/RESULTS.md). Elsewhere it is a 64-byte-aligned heap block.
 * KKV_HUGEPAGES=0 in the environment leaves the mappings unadvised.
 *
 * The memory is zero-filled, and pages are made resident only when first
 * written: an unused tail costs address space, not RAM (at most one 2 MiB
 * page past what was written). */
#ifndef KKV_CORE_BIGMEM_H
#define KKV_CORE_BIGMEM_H

#include <stddef.h>

#include "core/export.h"

/* Under AddressSanitizer every block is a heap block with redzones, and
 * callers carve one object per block (KKV_BIG_CARVE 0), so an overrun of
 * one object is still reported instead of landing in its neighbour. */
#if defined(__SANITIZE_ADDRESS__)
#define KKV_BIG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KKV_BIG_ASAN 1
#endif
#endif
#ifdef KKV_BIG_ASAN
#define KKV_BIG_CARVE 0
#else
#define KKV_BIG_CARVE 1
#endif

/* Granule the huge-page path rounds sizes and aligns to. */
#define KKV_BIG_ALIGN ((size_t)2 << 20)

/* A zeroed block of `bytes` (0 < bytes <= SIZE_MAX / 2), or NULL when the
 * size is out of that range or the OS refuses. The caller
 * owns it and gives it back with kkv_big_free(p, the same bytes). */
KKV_LAYER_API void *kkv_big_alloc(size_t bytes);
/* Frees a kkv_big_alloc block; p NULL is a no-op. */
KKV_LAYER_API void kkv_big_free(void *p, size_t bytes);

#endif
