/* A growable little-endian byte buffer for tests that write GGUF files by
 * hand (test_model.c, test_chat.c). Aborts on out of memory: tests only. */
#ifndef KKV_TU_BYTES_H
#define KKV_TU_BYTES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct wbuf {
    unsigned char *p; /* [cap] */
    size_t         n, cap;
} wbuf;

static inline void put(wbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline void put_u32(wbuf *b, uint32_t v) {
    unsigned char t[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(b, t, 4);
}
static inline void put_u64(wbuf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}
static inline void put_f32(wbuf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(b, u);
}
/* A GGUF string: u64 length, then the bytes. */
static inline void put_str(wbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

#endif
