/* Bounded reads of untrusted files, shared by the library's loaders, the CLI
 * and the fuzz targets: a whole file with a size cap, and the layout of a 2-D
 * float32 tensor file (.npy or raw). Library rules: a kkv_status, a one-line
 * message, nothing printed. */
#ifndef KKV_CORE_FILEIO_H
#define KKV_CORE_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv.h"

/* Default cap for text inputs (prompts, evaluation text): far above any real
 * text, far below what would exhaust memory (so /dev/zero fails fast). */
#define KKV_TEXT_MAX_BYTES ((size_t)256 << 20)

/* Reads the whole of path into a malloc'd buffer with a NUL after the data
 * (*out, freed by the caller; *len = bytes without the NUL). Pipes, FIFOs and
 * character devices are read until EOF but never beyond max_bytes.
 * KKV_ERR_IO (cannot open: strerror; a directory; a read error),
 * KKV_ERR_INVALID_ARG (more than max_bytes), KKV_ERR_NOMEM. On failure *out is
 * NULL. */
kkv_status kkv_file_read(char **out, size_t *len, const char *path, size_t max_bytes);

/* Where the [rows][cols] float32 data of a tensor file image lies: a .npy
 * ('\x93NUMPY' magic; '<f4', C order, 2-D, cols checked) or raw little-endian
 * rows (len must be a multiple of 4*cols). *data_off is the byte offset of the
 * data in buf; every size is checked for overflow and against len, so
 * *rows * cols * 4 == len - *data_off on success. KKV_ERR_FORMAT (with the
 * reason), KKV_ERR_INVALID_ARG (cols < 1, NULL). `name` only labels messages. */
kkv_status kkv_tensor_parse(int64_t *rows, size_t *data_off, const void *buf, size_t len,
                            int cols, const char *name);

#endif
