/* int8 rows of the sink (sink_int8, docs/FORMAT.md section 5): one token
 * vector as D signed codes and one fp16 absmax scale. Symmetric, because a
 * row's channels centre on 0 (unlike a key channel along tokens), and per
 * row, because sink tokens arrive one at a time and never change. */
#include <math.h>

#include "core/fp16.h"
#include "quant/quant.h"

void kkv_row8_encode(uint8_t *row, const float *x, int D) {
    float y[KKV_MAX_HEAD_DIM], amax = 0.0f; /* [D] x rounded to fp16, as every input */
    for (int j = 0; j < D; j++) {
        y[j] = kkv_f16_round(x[j]);
        amax = fabsf(y[j]) > amax ? fabsf(y[j]) : amax;
    }
    uint16_t scale16 = kkv_f16_store(amax / 127.0f);
    float scale = kkv_f16_to_f32(scale16);
    for (int j = 0; j < D; j++) {
        float q = scale > 0.0f ? rintf(y[j] / scale) : 0.0f;
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q); /* scale rounded down */
        row[j] = (uint8_t)(int8_t)q;
    }
    kkv_st16(row + D, scale16);
}

void kkv_row8_decode(float *x, const uint8_t *row, int D) {
    float scale = kkv_f16_to_f32(kkv_ld16(row + D));
    for (int j = 0; j < D; j++) x[j] = (float)(int8_t)row[j] * scale;
}
