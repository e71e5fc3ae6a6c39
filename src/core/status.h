/* Internal error reporting: every failing path returns kkv_fail(...). */
#ifndef KKV_CORE_STATUS_H
#define KKV_CORE_STATUS_H

#include "core/export.h"
#include "kittykv.h"

#if defined(__GNUC__)
#define KKV_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KKV_PRINTF(a, b)
#endif

/* Records a printf-style message as kkv_last_error() and returns s. */
KKV_LAYER_API kkv_status kkv_fail(kkv_status s, const char *fmt, ...) KKV_PRINTF(2, 3);

/* Empties kkv_last_error(): a successful call that tried optional lookups on
 * the way (which set messages) ends with this, so no stale message remains. */
KKV_LAYER_API void kkv_clear_error(void);

/* Untrusted bytes (a name from a file) made safe to echo in a message:
 * printable ASCII kept, anything else as \xNN, cut with "..." to fit buf
 * [cap]. Returns buf. */
KKV_LAYER_API const char *kkv_printable(char *buf, size_t cap, const void *bytes, size_t n);

/* Propagates a failing status unchanged (its message is already set). */
#define KKV_TRY(expr)                                                          \
    do {                                                                       \
        kkv_status kkv_try_s_ = (expr);                                        \
        if (kkv_try_s_ != KKV_OK) return kkv_try_s_;                           \
    } while (0)

#endif
