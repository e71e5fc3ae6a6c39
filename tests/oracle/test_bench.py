#!/usr/bin/env python3
"""Smoke test of `kittykv bench`: every subcommand on a tiny setting, the
--json object on the last line parses and has the required keys, and the
figures that are exact (not timings) are checked exactly: bytes per token of
fp16, the number of page-writing flush calls, the sequence count at a budget.

Usage: test_bench.py --kittykv PATH/TO/kittykv [--source-dir REPO] [-v]
Exit 0 all passed, 1 some failed, 77 when the model is missing (unless
KKV_REQUIRE_ORACLE=1). The attention checks need no model and run anyway.
Prints "N passed, M failed" at the end. Takes well under a minute.
"""
import argparse
import json
import os
import subprocess
import sys

# The default model's shapes (SmolLM2-135M): layers, KV heads, head_dim.
L, H, D = 30, 3, 64


class Tally:
    def __init__(self, verbose=False):
        self.passed = 0
        self.failed = 0
        self.verbose = verbose

    def check(self, ok, what):
        if ok:
            self.passed += 1
            if self.verbose:
                print("ok   " + what)
        else:
            self.failed += 1
            print("FAIL " + what, flush=True)
        return ok


def run(exe, args, env):
    p = subprocess.run([exe, "bench"] + args, capture_output=True, text=True, env=env,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def last_json(t, name, out):
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    if not t.check(bool(lines), name + ": prints something"):
        return None
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        t.check(False, name + ": last line is JSON")
        return None
    t.check(isinstance(obj, dict), name + ": last line is a JSON object")
    t.check(len(lines) > 1, name + ": a table precedes the JSON line")
    return obj


def has_keys(t, name, obj, keys):
    missing = [k for k in keys if k not in obj]
    return t.check(not missing, "%s: keys present (missing %s)" % (name, missing))


def bench_ok(t, exe, env, name, args):
    rc, out, err = run(exe, args, env)
    if not t.check(rc == 0, "%s exits 0 (rc %d; stderr: %s)" % (name, rc, err.strip()[-300:])):
        return None
    return last_json(t, name, out)


def test_usage(t, exe, env):
    for args, what in [(["nosuch"], "unknown subcommand"),
                       (["attention", "--bogus"], "unknown option"),
                       (["attention", "--methods", "fp16,nosuch"], "unknown method"),
                       (["attention", "--ctx", "12,x"], "bad context list"),
                       (["decode", "-n", "0"], "-n 0"),
                       (["flush", "--method", "fp16,kitty"], "--method with a list"),
                       (["serve", "--ctx", "1,2"], "serve takes one --ctx"),
                       (["attention", "--depth", "5"], "--depth is not an attention option")]:
        rc, _, err = run(exe, args, env)
        t.check(rc == 2 and err.strip() != "", "usage error (%s) exits 2 with a message" % what)
    rc, out, _ = run(exe, ["--help"], env)
    t.check(rc == 0 and all(s in out for s in ("attention", "decode", "flush", "serve")),
            "bench --help lists the four subcommands")
    for sub in ("attention", "decode", "flush", "serve"):
        rc, out, _ = run(exe, [sub, "--help"], env)
        t.check(rc == 0 and "usage" in out, "bench %s --help" % sub)


def test_attention(t, exe, env, kernel):
    ctxs = [300, 600]
    methods = ["fp16", "kivi-k2v2", "kitty"]
    name = "attention(%s)" % kernel
    obj = bench_ok(t, exe, env, name,
                   ["attention", "--ctx", ",".join(map(str, ctxs)), "--methods",
                    ",".join(methods), "--reps", "2", "--bw-mb", "16", "-t", "1",
                    "--kernel", kernel, "--json"])
    if obj is None:
        return
    if not has_keys(t, name, obj, ["bandwidth_gbs", "rows", "kernel", "threads"]):
        return
    t.check(obj["bandwidth_gbs"] > 0, name + ": bandwidth > 0")
    t.check(obj.get("bandwidth_4k_pages_gbs", 0) > 0 and obj.get("bandwidth_2m_pages_gbs", 0) > 0,
            name + ": read bandwidths on 4 KiB and 2 MiB pages")
    t.check(obj["bandwidth_gbs"] == max(obj.get("bandwidth_4k_pages_gbs", 0),
                                        obj.get("bandwidth_2m_pages_gbs", 0)),
            name + ": the roofline is the faster page size's read test")
    if kernel != "auto":
        t.check(obj["kernel"] == kernel, name + ": the requested kernel ran")
    rows = obj["rows"]
    t.check(len(rows) == len(ctxs) * len(methods), name + ": one row per (ctx, method)")
    by = {}
    for r in rows:
        if not has_keys(t, name + " row", r, ["method", "ctx", "us_per_token",
                                              "bytes_per_token", "gbs", "speedup_vs_fp16"]):
            return
        by[(r["method"], r["ctx"])] = r
        t.check(r["us_per_token"] > 0, "%s %s@%d: time > 0" % (name, r["method"], r["ctx"]))
        gbs = r["bytes_per_token"] / (r["us_per_token"] * 1e-6) * 1e-9
        t.check(abs(gbs - r["gbs"]) <= 1e-3 * gbs + 1e-6,
                "%s %s@%d: gbs = bytes / time" % (name, r["method"], r["ctx"]))
    for c in ctxs:
        f = by.get(("fp16", c))
        k = by.get(("kitty", c))
        if not (f and k):
            t.check(False, name + ": fp16 and kitty rows at ctx %d" % c)
            continue
        # fp16 stores every token of every layer and KV head, K and V, 2 bytes each
        t.check(f["bytes_per_token"] == 2 * 2 * c * L * H * D,
                "%s: fp16 bytes/token at %d = 4*ctx*L*H*D exactly (%d)" %
                (name, c, f["bytes_per_token"]))
        t.check(abs(f["speedup_vs_fp16"] - 1.0) < 1e-9, name + ": fp16 speedup is 1")
        t.check(k["bytes_per_token"] < f["bytes_per_token"],
                "%s: kitty reads fewer bytes than fp16 at %d" % (name, c))
        want = f["us_per_token"] / k["us_per_token"]
        t.check(abs(k["speedup_vs_fp16"] - want) <= 1e-3 * want,
                name + ": speedup = fp16 time / kitty time")


def test_scaling(t, exe, env):
    """--scaling: each method also on a one-thread cache, in the same rounds."""
    name = "attention --scaling"
    obj = bench_ok(t, exe, env, name,
                   ["attention", "--ctx", "300", "--methods", "fp16,kitty", "--reps", "2",
                    "--bw-mb", "16", "-t", "2", "--scaling", "--json"])
    if obj is None or not has_keys(t, name, obj, ["rows", "scaling", "threads",
                                                  "bandwidth_one_thread_gbs"]):
        return
    t.check(obj["bandwidth_one_thread_gbs"] > 0, name + ": a one-thread read bandwidth")
    sc = obj["scaling"]
    t.check(obj["threads"] == 2 and len(sc) == 2 and len(obj["rows"]) == 2,
            name + ": one scaling row per (ctx, method), beside the 2-thread rows")
    rows = {(r["method"], r["ctx"]): r for r in obj["rows"]}
    for s in sc:
        if not has_keys(t, name + " row", s, ["method", "ctx", "us_one_thread", "us_threads",
                                               "speedup"]):
            return
        r = rows.get((s["method"], s["ctx"]))
        t.check(r is not None and abs(r["us_per_token"] - s["us_threads"]) <= 1e-6 * s["us_threads"],
                "%s %s: us_threads is the table's 2-thread median" % (name, s["method"]))
        want = s["us_one_thread"] / s["us_threads"]
        t.check(s["us_one_thread"] > 0 and abs(s["speedup"] - want) <= 1e-3 * want,
                "%s %s: speedup = one-thread time / 2-thread time" % (name, s["method"]))
    p = run(exe, ["attention", "--ctx", "300", "--methods", "kitty", "--reps", "1",
                  "--bw-mb", "16", "-t", "1", "--scaling", "--json"], env)
    t.check(p[0] == 0 and "needs -t above 1" in p[2] and '"scaling"' not in p[1],
            name + " with -t 1: a warning, no scaling rows")


def matrix_bytes(model):
    """Bytes of the weight matrices a decode step streams, from the GGUF itself
    (the gguf package): every tensor of two or more dimensions, token_embd
    only when it is also the output matrix (no output.weight). Every row count
    of the default model is a multiple of the packed group (8 or 16), so
    packing adds nothing."""
    try:
        import gguf
    except ImportError:
        return None
    r = gguf.GGUFReader(model)
    names = {x.name for x in r.tensors}
    total = 0
    for x in r.tensors:
        if len([d for d in x.shape if d > 1]) < 2:
            continue
        if x.name == "token_embd.weight" and "output.weight" in names:
            continue
        total += int(x.n_bytes)
    return total


def test_decode(t, exe, env):
    obj = bench_ok(t, exe, env, "decode",
                   ["decode", "--depth", "0,300", "-n", "2", "--methods", "fp16,kitty",
                    "--bw-mb", "16", "--json"])
    if obj is None or not has_keys(t, "decode", obj, ["rows", "threads", "context", "bandwidth_gbs",
                                                      "weight_bytes_per_step"]):
        return
    rows = obj["rows"]
    t.check(len(rows) == 4, "decode: one row per (depth, method)")
    want = matrix_bytes(env["KKV_MODEL"])
    wb = obj["weight_bytes_per_step"]
    if want is not None:
        t.check(wb == want, "decode: weight bytes per step %s = the GGUF's matrices %s" % (wb, want))
    bw = obj["bandwidth_gbs"]
    t.check(bw > 0, "decode: a read bandwidth")
    for r in rows:
        if has_keys(t, "decode row", r, ["method", "depth", "tok_s", "ms_per_token",
                                         "speedup_vs_fp16", "bytes_per_step", "roofline"]):
            t.check(r["tok_s"] > 0 and abs(r["tok_s"] * r["ms_per_token"] - 1e3) < 1e-2 * 1e3,
                    "decode %s@%d: tok/s = 1000 / ms" % (r["method"], r["depth"]))
            # the depth-300 sequence holds 301+ tokens of K/V (2 x L x H x D fp16 each for fp16)
            kv = r["bytes_per_step"] - wb
            lo = 2 * L * H * D * 2 * (r["depth"] + 1) if r["method"] == "fp16" else 1
            t.check(kv >= lo, "decode %s@%d: bytes per step = weights + the sequence's K/V "
                    "(K/V %s, at least %s)" % (r["method"], r["depth"], kv, lo))
            want_rl = r["bytes_per_step"] / (r["ms_per_step"] * 1e-3) * 1e-9 / bw
            t.check(abs(r["roofline"] - want_rl) <= 1e-3 * want_rl,
                    "decode %s@%d: roofline = bytes / step / read bandwidth" % (r["method"], r["depth"]))
    by = {(r["method"], r["depth"]): r for r in rows}
    if ("kitty", 300) in by and ("fp16", 300) in by:
        t.check(by[("kitty", 300)]["bytes_per_step"] < by[("fp16", 300)]["bytes_per_step"],
                "decode: kitty reads fewer bytes than fp16 at depth 300")
    t.check(sorted({r["depth"] for r in rows}) == [0, 300], "decode: the depths asked for")

    name = "decode --scaling"
    obj = bench_ok(t, exe, env, name,
                   ["decode", "--depth", "0", "-n", "2", "--methods", "kitty", "-t", "2",
                    "--bw-mb", "16", "--scaling", "--json"])
    if obj is None or not has_keys(t, name, obj, ["rows", "scaling", "bandwidth_one_thread_gbs"]):
        return
    t.check(obj["bandwidth_one_thread_gbs"] > 0, name + ": a one-thread read bandwidth")
    sc, rows = obj["scaling"], obj["rows"]
    t.check(len(sc) == 1 and len(rows) == 1, name + ": one scaling row per (depth, method)")
    if sc and rows and has_keys(t, name + " row", sc[0], ["ms_one_thread", "ms_threads",
                                                           "speedup"]):
        s0 = sc[0]
        t.check(abs(s0["ms_threads"] - rows[0]["ms_per_step"]) <= 1e-6 * s0["ms_threads"],
                name + ": ms_threads is the table's 2-thread median")
        want = s0["ms_one_thread"] / s0["ms_threads"]
        t.check(s0["ms_one_thread"] > 0 and abs(s0["speedup"] - want) <= 1e-3 * want,
                name + ": speedup = one-thread time / 2-thread time")

    name = "decode --parts"
    obj = bench_ok(t, exe, env, name,
                   ["decode", "--depth", "0,300", "-n", "3", "--methods", "fp16,kitty", "-t", "2",
                    "--bw-mb", "16", "--parts", "--json"])
    if obj is None or not has_keys(t, name, obj, ["rows", "parts"]):
        return
    parts, rows = obj["parts"], obj["rows"]
    names = ["qkv", "attention", "out_proj", "ffn", "head", "other"]
    t.check(len(parts) == len(rows) == 4, name + ": one parts row per (depth, method)")
    for pr, r in zip(parts, rows):
        if not has_keys(t, name + " row", pr, ["method", "depth"] + [n + "_ms" for n in names]):
            continue
        t.check((pr["method"], pr["depth"]) == (r["method"], r["depth"]),
                name + ": rows in the table's order")
        t.check(all(pr[n + "_ms"] >= 0 for n in names) and
                all(pr[n + "_ms"] > 0 for n in ["qkv", "attention", "ffn", "head"]),
                name + " %s@%d: every part timed" % (pr["method"], pr["depth"]))
        total = sum(pr[n + "_ms"] for n in names)
        # the parts are the mean step; the table's figure is the median: same order
        t.check(0.3 * r["ms_per_step"] < total < 3.0 * r["ms_per_step"],
                name + " %s@%d: parts %.3f ms against the median step %.3f ms" %
                (pr["method"], pr["depth"], total, r["ms_per_step"]))


def test_flush(t, exe, env):
    n = 300
    obj = bench_ok(t, exe, env, "flush",
                   ["flush", "--method", "kitty", "-n", str(n), "--no-baseline", "--json"])
    if obj is None or not has_keys(t, "flush", obj, ["primitive", "latency", "flush_share_pct"]):
        return
    p = obj["primitive"]
    if has_keys(t, "flush primitive", p, ["page_calls", "other_calls", "page_call_us_p50",
                                          "pages_per_call", "flush_us_per_token"]):
        # kitty: S=32, G=R=128. Key pages complete at len 160 and 288, the
        # first value page at len 288 (32 sink + 128 window + 128): two
        # page-writing calls per layer, 3 key + 3 value + 3 key pages.
        t.check(p["page_calls"] == 2 * L, "flush: %d page-writing calls (got %s)" %
                (2 * L, p["page_calls"]))
        t.check(p["other_calls"] == n * L - 2 * L, "flush: the other calls are the rest")
        t.check(abs(p["pages_per_call"] - 9 * H / 3 / 2) < 1e-9,
                "flush: 4.5 pages per page-writing call (got %s)" % p["pages_per_call"])
        t.check(p["page_call_us_p50"] > 0, "flush: a page flush takes time")
    lat = obj["latency"]
    if lat is not None and has_keys(t, "flush latency", lat,
                                    ["p50_ms", "p99_ms", "max_ms", "p99_over_p50",
                                     "flush_steps"]):
        t.check(lat["n"] == n and lat["flush_steps"] == 2, "flush: %d steps, 2 flush steps" % n)
        t.check(lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"], "flush: p50 <= p99 <= max")
    t.check(obj.get("baseline_fp16", 0) is None, "flush: --no-baseline drops the fp16 run")


def test_serve(t, exe, env):
    budget = 64
    obj = bench_ok(t, exe, env, "serve",
                   ["serve", "--kv-budget", str(budget), "--ctx", "256", "-n", "2",
                    "--methods", "fp16,kitty", "--max-batch", "8", "--json"])
    if obj is None or not has_keys(t, "serve", obj, ["rows", "kv_budget_mb", "ctx"]):
        return
    rows = {r["method"]: r for r in obj["rows"]}
    for m in ("fp16", "kitty"):
        r = rows.get(m)
        if not t.check(r is not None, "serve: row for " + m):
            return
        if not has_keys(t, "serve " + m, r, ["max_seqs", "bytes_per_seq", "batch", "capped",
                                             "tok_s", "seqs_vs_fp16", "tok_s_vs_fp16"]):
            return
        b = budget << 20
        # counted, not estimated: n sequences fit and n + 1 would not
        t.check(r["max_seqs"] * r["bytes_per_seq"] <= b < (r["max_seqs"] + 1) * r["bytes_per_seq"],
                "serve %s: %d x %d bytes fit %d MiB, one more would not" %
                (m, r["max_seqs"], r["bytes_per_seq"], budget))
        t.check(r["batch"] == min(r["max_seqs"], 8) and r["capped"] == (r["max_seqs"] > 8),
                "serve %s: batch capped by --max-batch" % m)
        t.check(r["tok_s"] > 0, "serve %s: tok/s > 0" % m)
    t.check(rows["kitty"]["max_seqs"] > rows["fp16"]["max_seqs"],
            "serve: more kitty sequences fit than fp16")
    want = rows["kitty"]["max_seqs"] / rows["fp16"]["max_seqs"]
    t.check(abs(rows["kitty"]["seqs_vs_fp16"] - want) < 1e-4 * want, "serve: seqs ratio")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    require = os.environ.get("KKV_REQUIRE_ORACLE") == "1"
    model = os.environ.get("KKV_MODEL") or os.path.join(
        a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    env = dict(os.environ, KKV_PROGRESS="0")
    have_model = os.path.exists(model)
    if have_model:
        env["KKV_MODEL"] = model
    t = Tally(a.verbose)
    test_usage(t, a.kittykv, env)
    test_attention(t, a.kittykv, env, "auto")
    test_attention(t, a.kittykv, env, "scalar")
    test_scaling(t, a.kittykv, env)
    if have_model:
        test_decode(t, a.kittykv, env)
        test_flush(t, a.kittykv, env)
        test_serve(t, a.kittykv, env)
    print("%d passed, %d failed" % (t.passed, t.failed))
    if t.failed:
        return 1
    if not have_model:
        print("model %s missing: decode/flush/serve skipped" % model)
        if require:
            print("FAIL KKV_REQUIRE_ORACLE=1 but the model is missing")
            return 1
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
