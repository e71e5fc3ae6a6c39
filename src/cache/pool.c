/* Page pool: fixed byte budget, slots made lazily in chunks, a free stack. */
#include <stdlib.h>

#include "cache/cache.h"
#include "core/status.h"

kkv_status kkv_pool_take(kkv_cache *c, int *slot) {
    if (c->used + c->slot_bytes > c->budget)
        return kkv_fail(KKV_ERR_POOL_FULL,
                        "page pool full: %llu of %llu bytes in use, a page needs %zu",
                        (unsigned long long)c->used, (unsigned long long)c->budget,
                        c->slot_bytes);
    if (c->n_free == 0) {
        if (c->n_made >= c->max_slots)
            return kkv_fail(KKV_ERR_POOL_FULL, "page pool full: all %d pages in use",
                            c->max_slots);
        int chunk = c->n_made / KKV_SLOTS_PER_CHUNK;
        if (!c->chunks[chunk]) {
            c->chunks[chunk] = malloc(c->slot_bytes * KKV_SLOTS_PER_CHUNK);
            if (!c->chunks[chunk]) return kkv_fail(KKV_ERR_NOMEM, "page pool: out of memory");
        }
        c->free_slots[c->n_free++] = c->n_made++;
    }
    *slot = c->free_slots[--c->n_free];
    c->used += c->slot_bytes;
    return KKV_OK;
}

void kkv_pool_give(kkv_cache *c, int slot) {
    c->free_slots[c->n_free++] = slot;
    c->used -= c->slot_bytes;
}
