/* Boost budget pooled over the heads of a layer (budget=head|err, docs/FORMAT.md
 * section 5). The key pages of every KV head of a layer cover the same G
 * tokens and are formed at the same step, so round(alpha*D) * H boosted
 * channels can go wherever the page's data says they help most, while the
 * layer's bytes stay exactly the plain method's. */
#include <string.h>

#include "quant/quant.h"

/* Squared error over the G tokens of channel j at `bits`, with the range the
 * codec would use (min/max, or the clipped search). k: [G][D]. */
static double channel_err(const float *k, int D, int G, int j, int bits, int clip) {
    float mn = k[j], mx = k[j];
    for (int t = 1; t < G; t++) {
        float x = k[(size_t)t * D + j];
        mn = x < mn ? x : mn;
        mx = x > mx ? x : mx;
    }
    kkv_qparams p = clip ? kkv_qparams_search(k + j, (size_t)D, G, mn, mx, bits)
                         : kkv_qparams_of(mn, mx, bits);
    int maxq = (1 << bits) - 1;
    double e = 0.0;
    for (int t = 0; t < G; t++) {
        float x = k[(size_t)t * D + j];
        float d = x - ((float)kkv_quant_code(x, &p, maxq) * p.scale + p.mn);
        e += (double)d * d;
    }
    return e;
}

void kkv_boost_gain(float *score, const float *k, int D, int G, int clip) {
    for (int j = 0; j < D; j++)
        score[j] = (float)(channel_err(k, D, G, j, 2, clip) - channel_err(k, D, G, j, 4, clip));
}

/* A unit of boosting: one channel, or a RoPE pair boosted together. */
typedef struct unit {
    float   value; /* score per channel */
    uint8_t head, n, ch[2];
} unit;

/* a before b: larger value, then lower head, then lower first channel */
static int unit_before(const unit *a, const unit *b) {
    if (a->value != b->value) return a->value > b->value;
    if (a->head != b->head) return a->head < b->head;
    return a->ch[0] < b->ch[0];
}

int kkv_budget_alloc(uint8_t *order, int *nb, const float *score, int H, int D, int total,
                     int pairs, int neox, int rope_dims) {
    if (H <= 0 || H > KKV_MAX_BUDGET_HEADS || D <= 0 || D > KKV_MAX_HEAD_DIM || total < 0 ||
        total > H * D)
        return -1;
    unit u[KKV_MAX_BUDGET_HEADS * KKV_MAX_HEAD_DIM]; /* [H * D] at most */
    int nu = 0;
    int R = rope_dims > 0 && rope_dims <= D ? rope_dims & ~1 : D, half = R / 2;
    for (int h = 0; h < H; h++) {
        const float *s = score + (size_t)h * D;
        for (int j = 0; j < D; j++) {
            unit x = {0};
            x.head = (uint8_t)h;
            if (pairs && j < R) {
                int mate = neox ? (j < half ? j + half : j - half) : (j ^ 1);
                if (mate < j) continue; /* each pair once, from its lower channel */
                int hi = s[mate] > s[j]; /* ties keep the lower channel first */
                x.n = 2;
                x.ch[0] = (uint8_t)(hi ? mate : j);
                x.ch[1] = (uint8_t)(hi ? j : mate);
                x.value = 0.5f * (s[j] + s[mate]);
            } else {
                x.n = 1;
                x.ch[0] = x.ch[1] = (uint8_t)j;
                x.value = s[j];
            }
            /* insertion into the sorted list: at most H * D units */
            int i = nu++;
            while (i > 0 && unit_before(&x, &u[i - 1])) {
                u[i] = u[i - 1];
                i--;
            }
            u[i] = x;
        }
    }
    /* greedy: whole units while they fit; a pair that does not fit gives
     * its better channel, as kkv_rank_pairs' top-n_boost cut would */
    uint8_t taken[KKV_MAX_BUDGET_HEADS][KKV_MAX_HEAD_DIM];
    memset(taken, 0, sizeof taken);
    for (int h = 0; h < H; h++) nb[h] = 0;
    int left = total;
    for (int i = 0; i < nu && left > 0; i++) {
        int h = u[i].head, n = u[i].n < left ? u[i].n : left;
        for (int c = 0; c < n; c++) {
            order[(size_t)h * D + nb[h]++] = u[i].ch[c];
            taken[h][u[i].ch[c]] = 1;
        }
        left -= n;
    }
    /* the rest of each head's order: its unboosted channels, ascending */
    for (int h = 0; h < H; h++) {
        int r = nb[h];
        for (int j = 0; j < D; j++)
            if (!taken[h][j]) order[(size_t)h * D + r++] = (uint8_t)j;
    }
    return 0;
}
