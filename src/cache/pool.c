/* Page pool: slots made lazily in chunks (carved in order from huge-page
 * slabs, core/bigmem.h), a free stack and a reference count
 * per slot (forked sequences share pages). The byte budget is kept by the
 * callers' credit accounting (cache.c): c->used counts every slot in use once.
 * Sink blocks are reference-counted the same way. */
#include <stdlib.h>

#include "cache/cache.h"
#include "core/bigmem.h"
#include "core/status.h"

kkv_status kkv_pool_take(kkv_cache *c, int *slot) {
    if (c->n_free == 0) {
        if (c->n_made >= c->max_slots)
            return kkv_fail(KKV_ERR_POOL_FULL, "page pool full: all %d pages in use",
                            c->max_slots);
        if (c->n_made % KKV_SLOTS_PER_CHUNK == 0) {
            /* a new chunk: its memory, and room for its slots in the stack and counts */
            int chunk = c->n_made / KKV_SLOTS_PER_CHUNK;
            size_t n = (size_t)c->n_made + KKV_SLOTS_PER_CHUNK;
            int *fs = realloc(c->free_slots, n * sizeof *fs);
            if (fs) c->free_slots = fs;
            uint32_t *rf = fs ? realloc(c->ref, n * sizeof *rf) : NULL;
            if (rf) c->ref = rf;
            if (!rf) return kkv_fail(KKV_ERR_NOMEM, "page pool: out of memory for the slot table");
            if (!c->chunks[chunk]) {
                size_t slab = (size_t)chunk / (size_t)c->slab_chunks;
                if (!c->slabs[slab]) c->slabs[slab] = kkv_big_alloc(kkv_slab_bytes(c, slab));
                if (!c->slabs[slab])
                    return kkv_fail(KKV_ERR_NOMEM, "page pool: out of memory for a %zu-byte slab of pages",
                                    kkv_slab_bytes(c, slab));
                c->chunks[chunk] = c->slabs[slab] + (size_t)(chunk % c->slab_chunks) * kkv_chunk_stride(c);
            }
        }
        c->ref[c->n_made] = 0;
        c->free_slots[c->n_free++] = c->n_made++;
    }
    *slot = c->free_slots[--c->n_free];
    c->ref[*slot] = 1;
    c->n_used_slots++;
    return KKV_OK;
}

void kkv_pool_give(kkv_cache *c, int slot) {
    if (--c->ref[slot]) return;
    c->free_slots[c->n_free++] = slot;
    c->n_used_slots--;
    c->used -= c->slot_bytes;
}

void kkv_pool_untake(kkv_cache *c, int slot) {
    c->ref[slot] = 0;
    c->free_slots[c->n_free++] = slot;
    c->n_used_slots--;
}

kkv_sink *kkv_sink_new(const kkv_cache *c, int cs) {
    kkv_sink *b = malloc(sizeof *b + (size_t)kkv_sink_bytes(c, cs));
    if (b) b->ref = 1;
    return b;
}

void kkv_sink_drop(kkv_cache *c, kkv_sink *b, int cs) {
    if (!b || --b->ref) return;
    c->used -= kkv_sink_bytes(c, cs);
    free(b);
}
