/* Reading and writing 2-D float32 tensors: raw little-endian [rows][cols] or
 * NumPy .npy ('<f4', C order, 2-D). The format follows the file name. */
#ifndef KKV_CLI_TENSORIO_H
#define KKV_CLI_TENSORIO_H

#include <stddef.h>

/* Reads path into a malloc'd [*rows][cols] array. cols must be given for raw
 * files (rows = size / (4 * cols), size must divide evenly); for .npy it is
 * checked against the header. Returns NULL and writes a one-line reason into
 * err [errlen] on failure. */
float *tio_read(const char *path, int cols, long *rows, char *err, size_t errlen);

/* Writes x [rows][cols]; .npy when path ends in ".npy", else raw. 0 on success. */
int tio_write(const char *path, const float *x, long rows, int cols, char *err, size_t errlen);

#endif
