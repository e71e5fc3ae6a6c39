#!/usr/bin/env python3
"""Kitty vs fp16 on one paragraph: the KL divergence of the next-token
distribution at every position, plotted.

Notebook-style (the `# %%` cells run one by one in VS Code / Jupyter, or all
at once as a script):

    pip install .  matplotlib          # from the repository root
    python examples/compare_kl.py [--model GGUF] [--out docs/compare_kl.png]

Both caches see the same tokens in lock-step (kittykv's eval): at each
position the model runs once with an fp16 cache and once with a Kitty cache,
and KL(p_fp16 || p_kitty) compares the two predictions. Nothing is quantized
before the first key page is written (sink S + page size G tokens): the small
KL after the sink comes from the engine's fast matmuls, which round
activations to 8-bit blocks and so turn last-bit differences in attention
into visible ones (--exact uses exact fp32 matmuls: it drops to ~1e-7 there).
"""
# %% setup
import argparse
import os

import numpy as np

import kittykv

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", default=os.environ.get("KKV_MODEL") or os.path.join(
    HERE, "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
ap.add_argument("--methods", default="kitty,kivi-k2v2s",
                help="comma-separated specs compared with fp16 (default: kitty,kivi-k2v2s)")
ap.add_argument("--out", default="compare_kl.png")
ap.add_argument("--exact", action="store_true", help="exact fp32 matmuls (slower)")
args, _ = ap.parse_known_args()  # tolerate a notebook kernel's own arguments

# %% the paragraph
PARAGRAPH = (
    "When a language model writes a reply, it reads the whole conversation again for every "
    "new word, and to do that quickly it keeps, for each word it has already seen, two short "
    "lists of numbers called a key and a value. These lists are the model's working memory. "
    "They grow with every word, in every layer of the network, and for a long document they "
    "take more space than the model itself. A natural idea is to store them with fewer bits, "
    "the way a photograph can be saved with fewer colours, but the keys are stubborn: a few "
    "of their channels carry very large numbers, and squeezing those into two bits ruins the "
    "attention that depends on them. Kitty keeps most channels at two bits and gives the few "
    "unruly ones, chosen again for every page of a hundred and twenty-eight words, two bits "
    "more. The first words of the text and the most recent ones stay at full precision, "
    "because the model leans on them most. The result is a memory about five times smaller "
    "than the original, whose predictions stay close to those of the full-precision model. "
    "How close is what this example measures: for every position of this paragraph, it asks "
    "both versions of the model what word comes next and compares the two answers, as a "
    "divergence between probability distributions. Where the two agree the divergence is "
    "zero; where the compressed memory has lost something the model needed, it rises. Most "
    "of the time the answers are nearly identical, and the spikes, when they come, tend to "
    "fall on words that were hard to guess in the first place, such as names, numbers and "
    "the first word of a new sentence. A lighthouse keeper on a northern island kept such a "
    "log for forty years, noting the wind, the colour of the sea and every ship that passed, "
    "and his grandson, reading it long afterwards, could tell from the handwriting alone "
    "which winters had been hard.")

# %% run fp16 and the methods in lock-step
specs = args.methods.split(",")
with kittykv.Model(args.model, exact_matmul=args.exact) as model:
    n = len(model.tokenize(PARAGRAPH))
    print(f"{model.info['name'] or args.model}: {n} tokens")
    res = model.eval(PARAGRAPH, specs, score_from=1, keep_kld=True)

print(f"fp16 perplexity {res['fp16_ppl']:.3f}")
print(f"{'method':<14} {'bits/elem':>9} {'KL mean':>9} {'KL p99':>9} {'top-1':>7} {'dPPL%':>7}")
for m in res["methods"]:
    print(f"{m['name']:<14} {m['bits_per_element']:9.3f} {m['kld_mean']:9.4f} "
          f"{m['kld_p99']:9.4f} {m['top1']:7.3f} {m['dppl_pct']:+7.2f}")

# %% plot the KL per position
import matplotlib  # noqa: E402  (only the example needs it)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
pos = np.arange(1, res["tokens"])  # the prediction made after token i
for m in res["methods"]:
    kl = m["kld"]
    ax.plot(pos, kl, lw=0.8, alpha=0.85,
            label=f"{m['name']} ({m['bits_per_element']:.2f} bits, mean {m['kld_mean']:.3f})")
first = kittykv.Method.parse(specs[0])
page = first.sink + first.group
if page < res["tokens"]:
    ax.axvline(page, color="grey", ls=":", lw=1)
    ax.text(page + 3, 2e-4, f"first key page (S+G = {page})", fontsize=8, color="grey")
ax.set_xlabel("position in the paragraph (tokens)")
ax.set_ylabel("KL(fp16 || method), nats")
ax.set_title("Next-token KL divergence from an fp16 KV cache, SmolLM2-135M")
ax.set_yscale("symlog", linthresh=1e-3)
ax.set_ylim(0, max(float(m["kld"].max()) for m in res["methods"]) * 3)
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig(args.out)
print(f"wrote {args.out}")
