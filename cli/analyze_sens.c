/* analyze sensitivity and the oracle rankings: both need the post-RoPE
 * queries of a layer, which the public API does not expose (kkv_model_forward
 * computes them internally and hands them only to kkv_attend). Until the
 * library offers a query hook, these report that plainly instead of
 * approximating the queries. */
#include <stdio.h>

#include "analyze.h"

static void explain(const char *what) {
    fprintf(stderr,
            "kittykv analyze: %s needs each layer's post-RoPE queries, and the public API "
            "has no way to observe them (kkv_model_forward passes them straight to "
            "kkv_attend). It needs a hook such as kkv_model_set_qkv_hook(); see "
            "docs/RESULTS.md.\n",
            what);
}

int an_sensitivity(an_ctx *a) {
    (void)a;
    explain("sensitivity");
    return 1;
}

int an_oracle_ranks(an_ctx *a, uint8_t *ranks) {
    (void)a;
    (void)ranks;
    explain("the oracle selection");
    return 1;
}
