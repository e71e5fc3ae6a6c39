/* Fused decode attention over Kitty key/value pages (see kkv_cuda.h).
 *
 * One block per (KV head, page split); one thread per token of a page
 * (blockDim.x == G). Scores are computed in the code domain: the channel
 * scales are folded into the query once per page (qs_j = q_j * scale_j) and
 * the min term (sum_j q_j * mn_j) is added once, so the inner loop is an
 * unpack and a multiply-add per channel. The block then reduces max and sum,
 * and threads switch to one channel each to accumulate p_t * v_t from the
 * value codes (per-token scale folded into p, min term added once). */
#include <cuda_fp16.h>
#include <math.h>

#include "kkv_cuda.h"
#include "quant/layout.h"

#define MAX_REP 8
#define MAX_D 256

__device__ static float ld_half(const uint8_t *p) {
    __half h;
    unsigned short u = (unsigned short)(p[0] | (p[1] << 8));
    h = __ushort_as_half(u);
    return __half2float(h);
}

__device__ static float block_reduce(float v, float *red, bool is_max) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < n_warps; i++) r = is_max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

__global__ static void attend_pages_kernel(float *part_acc, float *part_ml,
                                           kkv_cuda_pages P, const float *q, int n_rep,
                                           int n_split) {
    const int h = blockIdx.x, split = blockIdx.y, t = threadIdx.x;
    const int D = P.head_dim, G = P.group, nb = P.n_boost;
    const kkv_key_layout KL = kkv_key_layout_of(D, G, nb);
    const kkv_value_layout VL = kkv_value_layout_of(D, G, P.value_bits);
    const size_t vrow = (size_t)D * P.value_bits / 8;
    const size_t vbytes = VL.bytes;
    const int per_split = (P.n_pages + n_split - 1) / n_split;
    const int p0 = split * per_split;
    const int p1 = min(P.n_pages, p0 + per_split);
    const float inv = rsqrtf((float)D);

    __shared__ float qs[MAX_REP][MAX_D]; /* query with channel scales folded in */
    __shared__ float prob[MAX_REP][1024];/* [n_rep][G] probabilities of this page */
    __shared__ float red[32];
    __shared__ float cbase[MAX_REP];     /* sum_j q_j * mn_j */

    float m[MAX_REP], l[MAX_REP], acc[MAX_REP]; /* acc: channel t (when t < D) */
    for (int r = 0; r < n_rep; r++) { m[r] = -INFINITY; l[r] = 0.f; acc[r] = 0.f; }

    for (int p = p0; p < p1; p++) {
        const uint8_t *kp = P.kpages + ((size_t)p * P.n_kv + h) * KL.bytes;
        const uint8_t *vp = P.vpages + ((size_t)p * P.n_kv + h) * vbytes;
        for (int j = t; j < D; j += blockDim.x)
            for (int r = 0; r < n_rep; r++)
                qs[r][j] = q[((size_t)h * n_rep + r) * D + j] * ld_half(kp + KL.scale + 2 * j);
        if (t < n_rep) {
            float c = 0.f;
            for (int j = 0; j < D; j++)
                c += q[((size_t)h * n_rep + t) * D + j] * ld_half(kp + KL.mn + 2 * j);
            cbase[t] = c;
        }
        __syncthreads();
        float s[MAX_REP];
        for (int r = 0; r < n_rep; r++) s[r] = cbase[r];
        const int byte = t >> 2, shift = 2 * (t & 3);
        for (int j = 0; j < D; j++) {
            int code = (kp[KL.lo + (size_t)j * (G / 4) + byte] >> shift) & 3;
            int row = kp[KL.idx + j];
            if (row < nb) code |= ((kp[KL.hi + (size_t)row * (G / 4) + byte] >> shift) & 3) << 2;
            for (int r = 0; r < n_rep; r++) s[r] += qs[r][j] * (float)code;
        }
        for (int r = 0; r < n_rep; r++) {
            float x = s[r] * inv;
            float mx = fmaxf(m[r], block_reduce(x, red, true));
            float e = __expf(x - mx);
            float sum = block_reduce(e, red, false);
            float corr = __expf(m[r] - mx);
            l[r] = l[r] * corr + sum;
            acc[r] *= corr;
            m[r] = mx;
            /* fold the token's value scale into p now; the min term separately */
            prob[r][t] = e;
        }
        __syncthreads();
        if (t < D) {
            const int bits = P.value_bits, per_byte = 8 / bits, maxq = (1 << bits) - 1;
            for (int r = 0; r < n_rep; r++) {
                float a = 0.f, pmn = 0.f;
                for (int u = 0; u < G; u++) {
                    const uint8_t *row = vp + (size_t)u * vrow;
                    float sc = ld_half(vp + VL.scale + 2 * u);
                    float mn = ld_half(vp + VL.mn + 2 * u);
                    int code = (row[t / per_byte] >> (bits * (t % per_byte))) & maxq;
                    a += prob[r][u] * sc * (float)code;
                    pmn += prob[r][u] * mn;
                }
                acc[r] += a + pmn;
            }
        }
        __syncthreads();
    }
    if (t < D)
        for (int r = 0; r < n_rep; r++)
            part_acc[(((size_t)h * n_rep + r) * n_split + split) * D + t] = acc[r];
    if (t == 0)
        for (int r = 0; r < n_rep; r++) {
            size_t i = ((size_t)h * n_rep + r) * n_split + split;
            part_ml[2 * i] = m[r];
            part_ml[2 * i + 1] = l[r];
        }
}

__global__ static void merge_kernel(float *out, const float *part_acc, const float *part_ml,
                                    int D, int n_split) {
    const int qh = blockIdx.x, j = threadIdx.x;
    if (j >= D) return;
    float m = -INFINITY, l = 0.f, o = 0.f;
    for (int s = 0; s < n_split; s++) {
        size_t i = (size_t)qh * n_split + s;
        float pm = part_ml[2 * i], pl = part_ml[2 * i + 1];
        if (pl == 0.f) continue; /* empty split */
        float mx = fmaxf(m, pm);
        float a = __expf(m - mx), b = __expf(pm - mx);
        o = o * a + part_acc[i * D + j] * b;
        l = l * a + pl * b;
        m = mx;
    }
    out[(size_t)qh * D + j] = l > 0.f ? o / l : 0.f;
}

extern "C" int kkv_cuda_attend_pages(float *part_acc, float *part_ml, const kkv_cuda_pages *pages,
                                     const float *q, int n_q, int n_split, void *stream) {
    if (!pages || pages->n_kv <= 0 || n_q % pages->n_kv || n_q / pages->n_kv > MAX_REP ||
        pages->head_dim > MAX_D || pages->group > 1024 || pages->group % 32 || n_split < 1 ||
        (pages->value_bits != 2 && pages->value_bits != 4 && pages->value_bits != 8))
        return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)pages->n_kv, (unsigned)n_split);
    attend_pages_kernel<<<grid, (unsigned)pages->group, 0, (cudaStream_t)stream>>>(
        part_acc, part_ml, *pages, q, n_q / pages->n_kv, n_split);
    return (int)cudaGetLastError();
}

extern "C" int kkv_cuda_merge(float *out, const float *part_acc, const float *part_ml, int n_q,
                              int D, int n_split, void *stream) {
    if (n_q <= 0 || D <= 0 || D > MAX_D || n_split < 1) return (int)cudaErrorInvalidValue;
    merge_kernel<<<(unsigned)n_q, (unsigned)D, 0, (cudaStream_t)stream>>>(out, part_acc, part_ml,
                                                                          D, n_split);
    return (int)cudaGetLastError();
}
