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

/* Propagates a failing status unchanged (its message is already set). */
#define KKV_TRY(expr)                                                          \
    do {                                                                       \
        kkv_status kkv_try_s_ = (expr);                                        \
        if (kkv_try_s_ != KKV_OK) return kkv_try_s_;                           \
    } while (0)

#endif
