/* GGUF (v2/v3) reader. The file is mapped read-only; every length, count,
 * offset and shape is checked against the file size at open time, so lookups
 * afterwards cannot read out of bounds. Strings point into the mapping and are
 * NOT NUL-terminated. */
#ifndef KKV_MODEL_GGUF_H
#define KKV_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv_model.h"

/* Metadata value types, numbered as in the GGUF format. */
typedef enum kkv_gguf_type {
    KKV_GGUF_U8 = 0, KKV_GGUF_I8 = 1, KKV_GGUF_U16 = 2, KKV_GGUF_I16 = 3,
    KKV_GGUF_U32 = 4, KKV_GGUF_I32 = 5, KKV_GGUF_F32 = 6, KKV_GGUF_BOOL = 7,
    KKV_GGUF_STRING = 8, KKV_GGUF_ARRAY = 9, KKV_GGUF_U64 = 10, KKV_GGUF_I64 = 11,
    KKV_GGUF_F64 = 12,
} kkv_gguf_type;

typedef struct kkv_gguf_str {
    const char *ptr; /* into the mapping, not NUL-terminated */
    uint64_t    len;
} kkv_gguf_str;

typedef struct kkv_gguf_tensor {
    kkv_gguf_str name;
    uint32_t     type;    /* ggml type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, 14 Q6_K, ...) */
    int          n_dims;  /* 1..4 */
    int64_t      ne[4];   /* ne[0] = row length (contiguous), unused dims = 1 */
    uint64_t     offset;  /* from the start of the data section */
    uint64_t     nbytes;  /* bytes of data, from the type's block size */
    const void  *data;    /* into the mapping; in bounds for nbytes */
} kkv_gguf_tensor;

typedef struct kkv_gguf kkv_gguf;

/* Maps and parses a file. KKV_ERR_IO if it cannot be opened/mapped,
 * KKV_ERR_FORMAT (message says what and where) if it is not valid GGUF,
 * KKV_ERR_UNSUPPORTED for a tensor type this build does not know the size of. */
kkv_status kkv_gguf_open(kkv_gguf **out, const char *path);
/* Parses a buffer the caller keeps alive and unchanged until kkv_gguf_close
 * (for fuzzing and tests). Same errors as kkv_gguf_open. */
kkv_status kkv_gguf_parse(kkv_gguf **out, const void *data, size_t size);
void       kkv_gguf_close(kkv_gguf *g);
/* Lets the system drop the mapped file pages wholly inside [p, p + n) (a
 * tensor whose bytes the caller has copied): a later read faults them back
 * in from the file, unchanged. Nothing for a parsed buffer (not a mapping). */
void       kkv_gguf_release(const kkv_gguf *g, const void *p, size_t n);

uint32_t   kkv_gguf_version(const kkv_gguf *g);
uint64_t   kkv_gguf_n_kv(const kkv_gguf *g);
/* Key name and type of metadata entry i (0 <= i < n_kv). */
kkv_gguf_str  kkv_gguf_kv_key(const kkv_gguf *g, uint64_t i);
kkv_gguf_type kkv_gguf_kv_type(const kkv_gguf *g, uint64_t i);
/* Index of a key, or -1. */
int64_t    kkv_gguf_find(const kkv_gguf *g, const char *key);

/* Typed getters. Integers convert between integer types when the value fits
 * (else KKV_ERR_FORMAT); f32 accepts F32 and F64. KKV_ERR_NOT_FOUND if the key
 * is missing, KKV_ERR_FORMAT if its type does not fit. */
kkv_status kkv_gguf_get_i64(const kkv_gguf *g, const char *key, int64_t *out);
kkv_status kkv_gguf_get_u32(const kkv_gguf *g, const char *key, uint32_t *out);
kkv_status kkv_gguf_get_f32(const kkv_gguf *g, const char *key, float *out);
kkv_status kkv_gguf_get_bool(const kkv_gguf *g, const char *key, int *out);
kkv_status kkv_gguf_get_str(const kkv_gguf *g, const char *key, kkv_gguf_str *out);
/* Arrays. For string arrays *out points to n descriptors owned by g. For
 * numeric arrays *data points to n packed little-endian elements of *elem_type
 * in the mapping (not necessarily aligned: use memcpy). */
kkv_status kkv_gguf_get_str_arr(const kkv_gguf *g, const char *key,
                                const kkv_gguf_str **out, uint64_t *n);
kkv_status kkv_gguf_get_arr(const kkv_gguf *g, const char *key, kkv_gguf_type *elem_type,
                            const void **data, uint64_t *n);

uint64_t   kkv_gguf_n_tensors(const kkv_gguf *g);
const kkv_gguf_tensor *kkv_gguf_tensor_at(const kkv_gguf *g, uint64_t i);
/* NULL if there is no tensor of that name. */
const kkv_gguf_tensor *kkv_gguf_find_tensor(const kkv_gguf *g, const char *name);

/* 1 if s equals the NUL-terminated c string. */
int kkv_gguf_str_eq(kkv_gguf_str s, const char *c);

/* ---- additions (declarations above are frozen) ---- */

/* general.alignment (32 when absent) and the byte offset of the data section
 * (end of the tensor infos rounded up to the alignment). */
uint32_t kkv_gguf_alignment(const kkv_gguf *g);
uint64_t kkv_gguf_data_offset(const kkv_gguf *g);

/* Everything about metadata entry i, for walking all entries (keys with
 * embedded NULs cannot be looked up by C string). All pointers borrow g. */
typedef struct kkv_gguf_value {
    kkv_gguf_type       type;
    uint64_t            offset;    /* byte offset of the value in the file */
    const void         *scalar;    /* numeric/bool: the value bytes (LE, unaligned) */
    kkv_gguf_str        str;       /* STRING */
    kkv_gguf_type       elem_type; /* ARRAY: element type (ARRAY = nested, skipped) */
    uint64_t            n;         /* ARRAY: element count */
    const void         *arr;       /* ARRAY of numbers/bools: n packed elements, else NULL */
    const kkv_gguf_str *strs;      /* ARRAY of STRING: n descriptors, else NULL */
} kkv_gguf_value;

/* *out = entry i. KKV_ERR_INVALID_ARG if i >= n_kv. */
kkv_status kkv_gguf_kv_value(kkv_gguf_value *out, const kkv_gguf *g, uint64_t i);

#endif
