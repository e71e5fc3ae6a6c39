/* Status names and the thread-local "last error" message. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

const char *kkv_status_str(kkv_status s) {
    switch (s) {
    case KKV_OK: return "ok";
    case KKV_ERR_INVALID_ARG: return "invalid argument";
    case KKV_ERR_NOMEM: return "out of memory";
    case KKV_ERR_POOL_FULL: return "page pool full";
    case KKV_ERR_IO: return "i/o error";
    case KKV_ERR_FORMAT: return "malformed file";
    case KKV_ERR_UNSUPPORTED: return "unsupported";
    case KKV_ERR_NONFINITE: return "non-finite input";
    case KKV_ERR_NOT_FOUND: return "not found";
    case KKV_ERR_CTX_FULL: return "context full";
    }
    return "unknown status";
}

const char *kkv_last_error(void) { return last_error; }

kkv_status kkv_fail(kkv_status s, const char *fmt, ...) {
    /* Format into a scratch buffer first: callers may pass kkv_last_error()
     * itself as an argument, and vsnprintf into its own source is undefined. */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return s;
}

void kkv_clear_error(void) { last_error[0] = 0; }

const char *kkv_printable(char *buf, size_t cap, const void *bytes, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    size_t o = 0;
    if (cap == 0) return "";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = b ? b[i] : 0;
        int plain = c >= 0x20 && c < 0x7f && c != '\\';
        size_t need = plain ? 1 : 4;
        if (o + need + 4 > cap) { /* room for "..." and the NUL */
            if (o + 4 <= cap) memcpy(buf + o, "...", 3), o += 3;
            break;
        }
        if (plain) buf[o++] = (char)c;
        else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    buf[o] = 0;
    return buf;
}
