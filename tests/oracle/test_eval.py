#!/usr/bin/env python3
"""CLI-level tests of the fidelity tools: kittykv eval, passkey and analyze.

Small settings only (the whole file runs in a few minutes on 2 cores). What
they pin down:
- fp16 against itself: KL exactly 0, top-1 1.0, for the reference alias
  "fp16" and for an independent fp16 cache ("fp16:group=128");
- 4-bit keys and values (kivi-k4v4) stay closer to fp16 than kivi-k2v2;
- scoring in chunks gives bit-identical results to single-token decode;
- the JSON shapes; bad specs and options are usage errors (exit 2);
- passkey: table + JSON, fp16 retrieves the key in a short haystack, a forked
  trial answers as the same trial run alone;
- every analyze subcommand writes its CSV/JSON/PNG files, the layers splice
  check is exact, sensitivity has D rows per KV head and agrees with the
  heatmap's magnitudes, and the ablation's oracle line is its own run.
Exit 77 (skip) when the model or gnuplot is missing, unless
KKV_REQUIRE_ORACLE=1.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg)
    return cond


def run(cli, args, expect=0):
    p = subprocess.run([cli] + args, capture_output=True, text=True, timeout=900)
    if p.returncode != expect:
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
        check(False, f"{' '.join(args)}: exit {p.returncode}, want {expect}")
    return p


def last_json(p):
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    return json.loads(lines[-1])


def test_eval(cli, model, text):
    methods = "fp16,fp16:group=128,kivi-k4v4,kivi-k2v2,kitty"
    p = run(cli, ["eval", "-m", model, "-f", text, "--ctx", "512", "--score-from", "160",
                  "--methods", methods, "--chunk", "64", "-t", "2", "--json"])
    if p.returncode:
        return
    j = last_json(p)
    check(j["tokens"] == 512 and j["scored"] == 352, f"tokens/scored {j['tokens']}/{j['scored']}")
    for key, typ in [("model", str), ("tokens", int), ("scored", int), ("methods", list)]:
        check(isinstance(j.get(key), typ), f"top-level key {key} missing or not {typ.__name__}")
    by = {m["name"]: m for m in j["methods"]}
    check(list(by) == methods.split(","), f"methods in order: {list(by)}")
    keys = {"name": str, "ppl": (int, float), "dppl_pct": (int, float),
            "kld_mean": (int, float), "kld_ci95": (int, float), "kld_p99": (int, float),
            "kld_max": (int, float),
            "top1": (int, float), "bits_per_element": (int, float), "kv_bytes": int}
    for m in j["methods"]:
        for k, t in keys.items():
            check(isinstance(m.get(k), t), f"{m.get('name')}: key {k} missing or mistyped")
    for name in ("fp16", "fp16:group=128"):
        m = by[name]
        check(m["kld_mean"] == 0 and m["kld_ci95"] == 0 and m["kld_p99"] == 0 and m["kld_max"] == 0,
              f"{name}: KL vs fp16 must be exactly 0, got {m['kld_mean']}/{m['kld_max']}")
        check(m["top1"] == 1.0, f"{name}: top-1 {m['top1']}")
        check(m["dppl_pct"] == 0 and m["ppl"] == j["fp16_ppl"], f"{name}: ppl {m['ppl']}")
        check(m["bits_per_element"] == 16.0, f"{name}: bits {m['bits_per_element']}")
    k4, k2 = by["kivi-k4v4"], by["kivi-k2v2"]
    check(k4["kld_mean"] < k2["kld_mean"],
          f"kivi-k4v4 KL {k4['kld_mean']} must be below kivi-k2v2 {k2['kld_mean']}")
    check(k4["top1"] >= k2["top1"], f"top-1 k4v4 {k4['top1']} < k2v2 {k2['top1']}")
    for name in ("kivi-k4v4", "kivi-k2v2", "kitty"):
        m = by[name]
        check(m["kld_mean"] > 0 and m["kld_p99"] > 0 and m["kld_max"] >= m["kld_p99"],
              f"{name}: KL stats inconsistent {m}")
        check(0 < m["bits_per_element"] < 16, f"{name}: bits {m['bits_per_element']}")
    for name in ("kivi-k2v2", "kitty"):
        m = by[name]
        check(0 < m["kld_ci95"] < m["kld_mean"],
              f"{name}: KLD interval {m['kld_ci95']} must be in (0, mean {m['kld_mean']})")
    check(k2["bits_per_element"] < k4["bits_per_element"], "k2v2 must use fewer bits than k4v4")
    check(k2["kv_bytes"] < by["fp16"]["kv_bytes"], "k2v2 must store fewer bytes than fp16")
    check("KLD mean" in p.stdout and "+-95%" in p.stdout and "kivi-k2v2" in p.stdout,
          "readable table on stdout")


def test_chunk_invariance(cli, model, text):
    out = []
    for chunk in ("1", "37"):
        p = run(cli, ["eval", "-m", model, "-f", text, "--ctx", "300", "--score-from", "150",
                      "--methods", "kitty:alpha=0.25:select=variance", "--chunk", chunk,
                      "-t", "2", "--json"])
        if p.returncode:
            return
        m = last_json(p)["methods"][0]
        out.append({k: v for k, v in m.items() if k != "seconds"})
    check(out[0] == out[1], f"chunk 1 vs 37 differ: {out}")
    check(out[0]["kld_mean"] > 0, "a quantized method must differ from fp16")


def test_usage_errors(cli, model, text):
    for spec in ("bogus", "kitty:alpha=2", "kitty:select=best", "kitty:nope=1", "kitty,kitty",
                 "fp16:seed=7", "kitty:", "kivi-k2v2:select=random", "kitty:seed=3",
                 "kitty:alpha=0.5:alpha=0.25",
                 "kitty:select=oracle"):
        p = run(cli, ["eval", "-m", model, "-f", text, "--ctx", "300", "--methods", spec], 2)
        check("kittykv eval" in p.stderr, f"spec {spec!r}: error names the command")
    run(cli, ["eval", "-m", model, "-f", text, "--ctx", "100", "--score-from", "100"], 2)
    run(cli, ["eval", "-m", model, "-f", "/nonexistent/text.txt", "--ctx", "300"], 1)
    run(cli, ["passkey", "-m", model, "--depths", "1.5"], 2)
    run(cli, ["analyze", "nosuch", "-m", model], 2)


def test_passkey(cli, model):
    p = run(cli, ["passkey", "-m", model, "--methods", "fp16,kivi-k2v2", "--lengths", "320",
                  "--depths", "0.2,0.8", "--trials", "1", "-t", "2", "--json"])
    if p.returncode:
        return
    j = last_json(p)
    res = j["results"]
    check(len(res) == 4, f"2 methods x 1 length x 2 depths, got {len(res)} cells")
    for r in res:
        for k in ("method", "length", "depth", "prompt_tokens", "correct", "trials",
                  "accuracy", "keys", "answers"):
            check(k in r, f"passkey cell lacks {k}")
        check(200 < r["prompt_tokens"] <= 320, f"prompt length {r['prompt_tokens']}")
        check(all(10000 <= k <= 99999 for k in r["keys"]), f"keys {r['keys']}")
        check(r["accuracy"] == r["correct"] / r["trials"], "accuracy = correct / trials")
    fp = [r for r in res if r["method"] == "fp16"]
    check(all(r["accuracy"] == 1.0 for r in fp), f"fp16 must find the key at 320 tokens: {fp}")
    check("d=0.20" in p.stdout and "kivi-k2v2" in p.stdout, "passkey table on stdout")

    # With several trials a cell prefills the shared haystack once and forks it
    # per trial; trial 0 must answer exactly as when it runs alone (no fork).
    runs = []
    for trials in ("1", "3"):
        q = run(cli, ["passkey", "-m", model, "--methods", "kitty,kitty-plus", "--lengths", "320",
                      "--depths", "0.8", "--trials", trials, "-t", "1", "--json"])
        if q.returncode:
            return
        runs.append(last_json(q)["results"])
    for alone, forked in zip(*runs):
        check(alone["keys"][0] == forked["keys"][0], "trial 0 has the same key")
        check(alone["answers"][0] == forked["answers"][0],
              f"{alone['method']}: forked trial 0 answered {forked['answers'][0]!r}, "
              f"alone {alone['answers'][0]!r}")


def png_ok(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == PNG_MAGIC and os.path.getsize(path) > 1000
    except OSError:
        return False


def test_sensitivity(cli, common, out):
    """Per-channel score MSE of layer 3: D rows per KV head, consistent ranks,
    and magnitudes that agree with the heatmap's (computed independently)."""
    p = run(cli, ["analyze", "sensitivity", "--ctx", "200", "--layer", "3"] + common)
    for h in range(3):
        check(png_ok(os.path.join(out, f"sensitivity_L3_h{h}.png")), f"sensitivity PNG head {h}")
    if p.returncode:
        return
    rows = [r.split(",") for r in open(os.path.join(out, "sensitivity.csv")).read().splitlines()]
    check(rows[0][:4] == ["layer", "head", "channel", "score_mse"], f"CSV header {rows[0]}")
    rows = rows[1:]
    check(len(rows) == 3 * 64, f"sensitivity CSV has 64 rows per KV head: {len(rows)}")
    j = json.load(open(os.path.join(out, "sensitivity.json")))
    hm = json.load(open(os.path.join(out, "heatmap.json")))
    check(j["layer"] == 3 and j["tokens"] == 200 and len(j["heads"]) == 3, "sensitivity JSON")
    for h in range(3):
        hr = [r for r in rows if int(r[1]) == h]
        check([int(r[2]) for r in hr] == list(range(64)), f"head {h}: channels 0..63 in order")
        mse = [float(r[3]) for r in hr]
        check(min(mse) >= 0 and max(mse) > 0, f"head {h}: MSE non-negative, not all 0")
        check(abs(sum(float(r[4]) for r in hr) - 1) < 1e-3, f"head {h}: MSE shares sum to 1")
        sr = [int(r[6]) for r in hr]
        check(sorted(sr) == list(range(64)), f"head {h}: sensitivity ranks are a permutation")
        top = j["heads"][h]["top_sensitivity"]
        check(top[0] == sr.index(0) and mse[top[0]] == max(mse), f"head {h}: top channel {top}")
        check(j["heads"][h]["top_magnitude"] == hm["heads"][h]["top_channels"],
              f"head {h}: magnitude ranking agrees with the heatmap")
        check(j["heads"][h]["mse_share_top_sensitivity"] >=
              j["heads"][h]["mse_share_top_magnitude"], f"head {h}: no top-8 beats the MSE top-8")
    check("top 8 by sensitivity" in p.stdout and "overlap" in p.stdout, "sensitivity summary")


def test_analyze(cli, model, text, out):
    common = ["-m", model, "-f", text, "--out", out, "-t", "2"]
    run(cli, ["analyze", "heatmap", "--ctx", "200", "--layer", "3"] + common)
    for f in ("heatmap_L3_h0.csv", "heatmap_L3_h2.csv", "heatmap.json"):
        check(os.path.exists(os.path.join(out, f)), f"heatmap wrote {f}")
    check(png_ok(os.path.join(out, "heatmap.png")), "heatmap.png is a PNG")
    with open(os.path.join(out, "heatmap_L3_h0.csv")) as f:
        rows = f.read().splitlines()
    check(len(rows) == 64 and len(rows[0].split(",")) == 200, "heatmap CSV is channels x tokens")
    test_sensitivity(cli, common, out)

    p = run(cli, ["analyze", "stability", "--ctx", "420"] + common)
    check(png_ok(os.path.join(out, "stability.png")), "stability.png is a PNG")
    if p.returncode == 0:
        j = json.load(open(os.path.join(out, "stability.json")))
        check(j["pages"] == 3 and j["boosted"] == 8, f"stability pages/boosted {j}")
        check(0 <= j["mean_jaccard"] <= 1 and len(j["layers"]) == 30, "stability JSON")
        check(abs(j["random_expectation"] - 0.070542) < 1e-5,
              f"E[Jaccard] of random 8-of-64 sets {j['random_expectation']}")

    p = run(cli, ["analyze", "ablation", "--ctx", "300", "--score-from", "200", "--alphas",
                  "0,0.25,1", "--selects", "magnitude,random,oracle"] + common)
    check(png_ok(os.path.join(out, "ablation.png")), "ablation.png is a PNG")
    if p.returncode == 0:
        rows = open(os.path.join(out, "ablation.csv")).read().splitlines()
        check(len(rows) == 1 + 3 * 3, f"ablation CSV rows {len(rows)}")
        check(sum(r.split(",")[1] == "oracle" for r in rows[1:]) == 3, "3 oracle rows in the CSV")
        j = json.load(open(os.path.join(out, "ablation.json")))
        kl = {(r["alpha"], r["select"]): r["kld_mean"] for r in j["runs"]}
        check(kl[(0, "magnitude")] == kl[(0, "random")], "alpha 0 does not depend on selection")
        check(kl[(1, "magnitude")] < kl[(0, "magnitude")], "alpha 1 beats alpha 0")
        check(kl[(0, "oracle")] == kl[(0, "magnitude")] and kl[(1, "oracle")] == kl[(1, "random")],
              "oracle at alpha 0 and 1 is the shared run")
        o = kl[(0.25, "oracle")]
        check(0 < o < kl[(0, "oracle")] and o not in (kl[(0.25, "magnitude")], kl[(0.25, "random")]),
              f"oracle at alpha 0.25 is its own run between alpha 0 and 1: {kl}")
        ranks = open(os.path.join(out, "oracle_ranks.csv")).read().splitlines()[1:]
        check(len(ranks) == 30 * 3, f"oracle rankings for 30 layers x 3 KV heads: {len(ranks)}")
        check(all(sorted(map(int, r.split(",")[2].split())) == list(range(64)) for r in ranks),
              "each oracle ranking is a permutation of the 64 channels")

    p = run(cli, ["analyze", "layers", "--ctx", "200", "--score-from", "150", "--positions",
                  "1"] + common)
    check(png_ok(os.path.join(out, "layers.png")), "layers.png is a PNG")
    if p.returncode == 0:
        j = json.load(open(os.path.join(out, "layers.json")))
        check(j["splice_check_max_kld"] == 0, f"layers splice check {j['splice_check_max_kld']}")
        check(len(j["layers"]) == 30 and abs(sum(l["share"] for l in j["layers"]) - 1) < 1e-3,
              "layer shares sum to 1")
        check(j["all_layers_kld_mean"] > 0, "quantizing every layer changes the output")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    model = os.environ.get("KKV_MODEL") or os.path.join(
        a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    text = os.path.join(a.source_dir, "data", "handbook.txt")
    missing = [p for p in (model, text) if not os.path.exists(p)]
    if not shutil.which("gnuplot"):
        missing.append("gnuplot")
    if missing:
        print("missing:", ", ".join(missing))
        return 1 if os.environ.get("KKV_REQUIRE_ORACLE") == "1" else 77
    os.environ.pop("KKV_PROGRESS", None)  # no progress bars in the captured stderr
    with tempfile.TemporaryDirectory() as out:
        test_usage_errors(a.kittykv, model, text)
        test_eval(a.kittykv, model, text)
        test_chunk_invariance(a.kittykv, model, text)
        test_passkey(a.kittykv, model)
        test_analyze(a.kittykv, model, text, out)
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        return 1
    print("all eval/passkey/analyze checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
