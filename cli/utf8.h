/* Streaming UTF-8 assembly for printing token pieces as they are generated:
 * a piece may end in the middle of a multi-byte character, so bytes are held
 * until their sequence is complete. The output is always valid UTF-8: each
 * maximal ill-formed subpart (Unicode's "substitution of maximal subparts")
 * becomes one U+FFFD. */
#ifndef KKV_CLI_UTF8_H
#define KKV_CLI_UTF8_H

#include <stddef.h>

typedef struct utf8_stream {
    unsigned char pend[4]; /* [n_pend] bytes of an incomplete sequence */
    int           n_pend;
    int           need;    /* total length of the pending sequence */
} utf8_stream;

/* Worst-case output bytes of one utf8_stream_feed of n bytes (or of a flush,
 * n = 0): every byte, held ones included, can become a 3-byte U+FFFD. */
#define UTF8_STREAM_BOUND(n) (3 * ((n) + 4))

void   utf8_stream_init(utf8_stream *s);
/* Feeds n bytes; writes the complete sequences they finish to out, which must
 * hold UTF8_STREAM_BOUND(n) bytes; returns the bytes written. */
size_t utf8_stream_feed(utf8_stream *s, char *out, const char *in, size_t n);
/* Ends the stream: a held incomplete sequence becomes U+FFFD. out: [3].
 * Returns the bytes written (0 or 3); the stream is empty again. */
size_t utf8_stream_flush(utf8_stream *s, char *out);

/* Length (1..4) of the valid UTF-8 sequence at p[0..n), or 0 if invalid or
 * truncated. */
size_t utf8_valid_len(const unsigned char *p, size_t n);

#endif
