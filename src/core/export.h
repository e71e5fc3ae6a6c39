/* Internal calls one layer's shared library makes into another's (the model
 * and eval libraries use the core's error reporting, thread pool and CPU
 * detection). They are exported from libkittykv.so with the kkv_ prefix but
 * are not public API: no header under include/ declares them. */
#ifndef KKV_CORE_EXPORT_H
#define KKV_CORE_EXPORT_H

#if defined(__GNUC__)
#define KKV_LAYER_API __attribute__((visibility("default")))
#else
#define KKV_LAYER_API
#endif

#endif
