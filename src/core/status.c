/* Status names and the thread-local "last error" message. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

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
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}
