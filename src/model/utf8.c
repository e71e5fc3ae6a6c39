/* UTF-8 validation and streaming assembly (kittykv_model.h): the one UTF-8
 * decoder of the library, shared by the tokenizer and detokenizing. */
#include <string.h>

#include "kittykv_model.h"

/* Length a lead byte announces and the allowed range of the byte after it;
 * 0 for bytes that cannot start a sequence. The narrowed second-byte ranges
 * exclude overlongs (E0, F0), surrogates (ED) and > U+10FFFF (F4). */
static int lead_info(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Whether byte c may come at position pos (>= 1) of a sequence led by lead. */
static int cont_ok(unsigned char lead, int pos, unsigned char c) {
    unsigned char lo, hi;
    lead_info(lead, &lo, &hi);
    if (pos == 1) return c >= lo && c <= hi;
    return c >= 0x80 && c <= 0xBF;
}

size_t kkv_utf8_valid_len(const unsigned char *p, size_t n) {
    if (n == 0) return 0;
    unsigned char lo, hi;
    int len = lead_info(p[0], &lo, &hi);
    if (len == 0 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if (!cont_ok(p[0], i, p[i])) return 0;
    return (size_t)len;
}

static size_t put_fffd(char *out) {
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}

void kkv_utf8_stream_init(kkv_utf8_stream *s) {
    memset(s, 0, sizeof *s);
}

size_t kkv_utf8_stream_feed(kkv_utf8_stream *s, char *out, const char *in, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (s->n_pend > 0) {
            if (cont_ok(s->pend[0], s->n_pend, c)) {
                s->pend[s->n_pend++] = c;
                if (s->n_pend == s->need) {
                    memcpy(out + w, s->pend, (size_t)s->n_pend);
                    w += (size_t)s->n_pend;
                    s->n_pend = 0;
                }
                continue;
            }
            /* The held prefix can never complete: one U+FFFD for it, then c
             * starts afresh. */
            w += put_fffd(out + w);
            s->n_pend = 0;
        }
        unsigned char lo, hi;
        int len = lead_info(c, &lo, &hi);
        if (len == 1) out[w++] = (char)c;
        else if (len == 0) w += put_fffd(out + w);
        else {
            s->pend[0] = c;
            s->n_pend = 1;
            s->need = len;
        }
    }
    return w;
}

size_t kkv_utf8_stream_flush(kkv_utf8_stream *s, char *out) {
    if (s->n_pend == 0) return 0;
    s->n_pend = 0;
    return put_fffd(out);
}
