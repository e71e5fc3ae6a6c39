#!/usr/bin/env python3
"""Drives `kittykv quantize` and compares it with the numpy oracle kitty_ref.py
(docs/FORMAT.md sections 1-3): reconstructed keys/values bitwise, key page bytes exactly,
--json byte counts exactly, and the CLI's error paths.

Usage: test_quant.py --kittykv PATH/TO/kittykv [--source-dir REPO] [--quick] [-v]
Exit 0 all passed, 1 some failed, 77 numpy missing (unless KKV_REQUIRE_ORACLE=1).
Prints "N passed, M failed" at the end.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    np = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


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


# ---------------------------------------------------------------- test data

def make_data(T, D, seed, extreme=True):
    """Keys with outlier channels, constant channels and out-of-fp16-range
    tokens; values with constant tokens and out-of-range entries.

    keys[t][j] = mu_j + sigma_j * N(0,1), sigma_j ~ U(0.5, 2), mu_j ~ U(-1, 1);
    max(1, D/16) outlier channels have sigma 15 and mu +-10; two channels (one
    if D < 16) are constant (0.75 and -3.0); every 97th token has +-1e5 or
    70000 or 65520 (beyond fp16 range: stored as +-65504) in one non-constant
    channel. values[t] = N(0,1) * U(0.5, 3) per token, every 50th token
    constant 1.25, every 89th has one entry at -1e6. extreme=False leaves out
    the beyond-fp16 entries (for the error figures: clamping would dominate)."""
    rng = np.random.default_rng(seed)
    sigma = rng.uniform(0.5, 2.0, D).astype(np.float32)
    mu = rng.uniform(-1, 1, D).astype(np.float32)
    n_out = max(1, D // 16)
    outl = rng.choice(D, n_out + 2, replace=False)
    const = outl[n_out:] if D >= 16 else outl[n_out:n_out + 1]
    outl = outl[:n_out]
    sigma[outl] = 15.0
    mu[outl] = np.where(rng.random(n_out) < 0.5, -10.0, 10.0)
    k = (mu + sigma * rng.standard_normal((T, D))).astype(np.float32)
    for i, j in enumerate(const):
        k[:, j] = (0.75, -3.0)[i % 2]
    free = np.setdiff1d(np.arange(D), const)
    big = np.array([1e5, -1e5, 70000.0, 65520.0, -65519.0], np.float32)
    for t in (range(5, T, 97) if extreme else ()):
        k[t, free[t % len(free)]] = big[(t // 97) % len(big)]
    v = (rng.standard_normal((T, D)) * rng.uniform(0.5, 3.0, (T, 1))).astype(np.float32)
    v[::50] = 1.25
    for t in (range(7, T, 89) if extreme else ()):
        v[t, t % D] = -1e6
    return k, v


def write_npy(path, a):
    np.save(path, np.ascontiguousarray(a, dtype=np.float32))


# ---------------------------------------------------------------- comparison helpers

def first_diff(a, b):
    ia = a.view(np.uint32)
    ib = b.view(np.uint32)
    bad = np.argwhere(ia != ib)
    return None if len(bad) == 0 else tuple(bad[0])


def region_of(t, counts, G, keys):
    if counts is None:
        return "fp16"
    s = counts["sink"]
    if t < s:
        return "sink"
    np_ = counts["kp"] if keys else counts["vp"]
    if t < s + np_ * G:
        return "page %d" % ((t - s) // G)
    return "Q-buffer/window"


def page_part(off, D, G, nb):
    parts = [("lo", D * G // 4), ("hi", nb * G // 4), ("idx", D), ("scale", 2 * D), ("mn", 2 * D)]
    for name, n in parts:
        if off < n:
            return "%s+%d" % (name, off)
        off -= n
    return "beyond"


def run(cli, args):
    p = subprocess.run([cli, "quantize"] + args, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


# ---------------------------------------------------------------- one CLI case

def cli_case(tl, cli, tmp, ref, name, T, D, seed, extra=(), method_kw=None, with_values=True,
             data=None, extreme=True):
    method_kw = method_kw or {}
    m = ref.Method(name, **method_kw)
    k, v = make_data(T, D, seed, extreme) if data is None else data
    kp, vp_ = os.path.join(tmp, "k.npy"), os.path.join(tmp, "v.npy")
    ok_, ov, opg = (os.path.join(tmp, x) for x in ("ok.npy", "ov.npy", "pages.bin"))
    for f in (ok_, ov, opg):
        if os.path.exists(f):
            os.remove(f)
    write_npy(kp, k)
    args = ["--method", name, "--head-dim", str(D), "--keys", kp, "--out-keys", ok_, "--json"]
    args += list(extra)
    if with_values:
        write_npy(vp_, v)
        args += ["--values", vp_, "--out-values", ov]
    if not m.fp16:
        args += ["--out-pages", opg]
    tag = "%s%s T=%d D=%d%s" % (name, " " + " ".join(extra) if extra else "", T, D,
                                "" if with_values else " keys-only")
    rc, out, err = run(cli, args)
    if not tl.check(rc == 0, "%s: exit %d: %s" % (tag, rc, err.strip())):
        return
    r = ref.lifecycle(m, k, v if with_values else None)
    counts = r.get("counts")
    # reconstructions, bitwise
    ck = np.load(ok_)
    good = ck.dtype == np.float32 and ck.shape == (T, D)
    if tl.check(good, "%s: out-keys dtype/shape %s %s" % (tag, ck.dtype, ck.shape)):
        d = first_diff(ck, r["keys"])
        tl.check(d is None, "%s: keys differ at token %s channel %s (%s): C %r oracle %r" % (
            tag, d and d[0], d and d[1], d and region_of(d[0], counts, m.group, True),
            d and float(ck[d]), d and float(r["keys"][d])))
    if with_values:
        cv = np.load(ov)
        good = cv.dtype == np.float32 and cv.shape == (T, D)
        if tl.check(good, "%s: out-values dtype/shape" % tag):
            d = first_diff(cv, r["values"])
            tl.check(d is None, "%s: values differ at token %s channel %s (%s): C %r oracle %r" % (
                tag, d and d[0], d and d[1], d and region_of(d[0], counts, m.group, False),
                d and float(cv[d]), d and float(r["values"][d])))
    # key pages, byte for byte
    if not m.fp16:
        data = open(opg, "rb").read()
        want = b"".join(r["pages"])
        if tl.check(len(data) == len(want), "%s: pages file %d bytes, oracle %d" % (
                tag, len(data), len(want))):
            if data != want:
                a = np.frombuffer(data, np.uint8)
                b = np.frombuffer(want, np.uint8)
                off = int(np.argmax(a != b))
                pb = ref.key8_page_bytes(D, m.group) if m.key_bits == 8 else \
                    ref.key_page_bytes(D, m.group, r["n_boost"])
                tl.check(False, "%s: page bytes differ: page %d at %s: C 0x%02x oracle 0x%02x" % (
                    tag, off // pb, page_part(off % pb, D, m.group, r["n_boost"]), a[off], b[off]))
            else:
                tl.check(True, tag + ": page bytes")
    # --json figures
    try:
        js = json.loads(out)
    except ValueError:
        tl.check(False, "%s: --json output is not JSON: %r" % (tag, out[:200]))
        return
    tl.check(js.get("bytes") == r["bytes"], "%s: json bytes %s, oracle %s" % (
        tag, js.get("bytes"), r["bytes"]))
    tl.check(js.get("n_boost") == r["n_boost"] and js.get("tokens") == T and
             js.get("head_dim") == D, "%s: json n_boost/tokens/head_dim %s/%s/%s, want %s/%d/%d" % (
                 tag, js.get("n_boost"), js.get("tokens"), js.get("head_dim"), r["n_boost"], T, D))
    elems = T * D * (2 if with_values else 1)
    bpe = 8.0 * r["bytes"]["total"] / elems
    tl.check(abs(js.get("bits_per_element", -1) - bpe) <= 5e-7 * max(1.0, bpe),
             "%s: bits/element %s, oracle %.6f" % (tag, js.get("bits_per_element"), bpe))

    def rel(x, y):
        x = x.astype(np.float64)
        y = y.astype(np.float64)
        den = np.sum(x * x)
        return float(np.sqrt(np.sum((x - y) ** 2) / den)) if den > 0 else float(np.sqrt(np.sum((x - y) ** 2)))

    ke = rel(k, r["keys"])
    tl.check(abs(js.get("key_rel_err", -1) - ke) <= 1e-6 * max(ke, 1e-12) + 1e-12,
             "%s: key_rel_err %s, oracle %.8g" % (tag, js.get("key_rel_err"), ke))
    if with_values:
        ve = rel(v, r["values"])
        tl.check(abs(js.get("value_rel_err", -1) - ve) <= 1e-6 * max(ve, 1e-12) + 1e-12,
                 "%s: value_rel_err %s, oracle %.8g" % (tag, js.get("value_rel_err"), ve))
    return js


# ---------------------------------------------------------------- oracle self-checks

def self_checks(tl, ref):
    """The oracle itself against hand-worked examples of the spec."""
    # spec 5: bytes per page (D=64, G=128)
    tl.check(ref.key_page_bytes(64, 128, 8) == 2624, "oracle: kitty key page 2624 B")
    tl.check(ref.key_page_bytes(64, 128, 16) == 2880, "oracle: kitty-pro key page 2880 B")
    tl.check(ref.value_page_bytes(64, 128, 2) == 2560, "oracle: value page 2560 B")
    tl.check(ref.Method("kitty").n_boost(64) == 8 and ref.Method("kitty").n_boost(128) == 16,
             "oracle: kitty boosts 8 of 64, 16 of 128")
    # packing: token t at bits 2*(t%4)
    tl.check(ref.pack2_rows(np.array([[1, 2, 3, 0, 3, 3, 3, 3]]))[0].tolist() == [0x39, 0xff],
             "oracle: 2-bit packing")
    tl.check(ref.pack4_rows(np.array([[0x3, 0xa]]))[0].tolist() == [0xa3], "oracle: 4-bit packing")
    # section 3 on a hand example: x = 0..3 -> scale 1, codes 0..3
    s16, m16 = ref.qparams(np.float32(0), np.float32(3), 2)
    q = ref.quantize(np.array([0, 1, 2, 3, 1.5, 2.49], np.float32), s16, m16, 2)
    tl.check(float(s16) == 1.0 and float(m16) == 0.0 and q.tolist() == [0, 1, 2, 3, 2, 2],
             "oracle: codes of 0..3 (half rounds up)")
    # constant group
    s16, m16 = ref.qparams(np.float32(0.75), np.float32(0.75), 4)
    tl.check(float(s16) == 0.0 and ref.quantize(np.float32([0.75]), s16, m16, 4).tolist() == [0],
             "oracle: constant group")
    # clamp beyond fp16
    tl.check(float(ref.f16r(np.float32(1e30))) == 65504.0 and
             float(ref.f16r(np.float32(-65520))) == -65504.0, "oracle: fp16 clamp")
    # magnitude ties go to the lower index; hi row r = rank r
    k = np.zeros((4, 4), np.float32)
    k[:, 2] = [0, 1, 2, 3]
    k[:, 1] = [0, 1, 2, 3]
    k[:, 3] = [0, 15, 0, 0]
    order = ref.rank_channels(k, "magnitude")
    tl.check(order.tolist() == [3, 1, 2, 0], "oracle: ranking %s" % order.tolist())
    page, dec = ref.key_page_encode(k, 2)
    idx = list(page[4 + 2:4 + 2 + 4])
    tl.check(idx == [2, 1, 2, 0], "oracle: idx %s" % idx)
    tl.check(page[4] == 0x00 | (3 << 2) and dec[1, 3] == 15.0, "oracle: hi row 0 = channel 3")
    tl.check(np.array_equal(dec[:, 2], [0, 1, 2, 3]), "oracle: 2-bit channel decodes 0..3 exactly")


def random_select(tl, cli, tmp):
    """--select random: reproducible for a seed, different for another seed."""
    k, _ = make_data(32 + 3 * 128, 64, 3)
    kp = os.path.join(tmp, "rk.npy")
    write_npy(kp, k)
    pages = []
    for i, seed in enumerate(("3", "3", "4")):
        out = os.path.join(tmp, "rp%d.bin" % i)
        rc, _, err = run(cli, ["--method", "kitty", "--select", "random", "--seed", seed,
                               "--head-dim", "64", "--keys", kp, "--out-pages", out])
        tl.check(rc == 0, "random select: exit %d %s" % (rc, err.strip()))
        pages.append(open(out, "rb").read() if rc == 0 else b"")
    tl.check(len(pages[0]) == 3 * 2624 and pages[0] == pages[1],
             "random select: same seed gives different pages")
    tl.check(pages[0] != pages[2], "random select: seeds 3 and 4 give identical pages")


def adversarial(tl, cli, tmp, ref):
    """Selections that only the spec's exact convention gets right."""
    tiny = np.float32(2.0 ** -24)  # the smallest fp16 subnormal
    G = 128
    # magnitude: channel 1 = [1, 2^-24 x 127] sums to 1 + 127*2^-24 exactly
    # (and pairwise), but to exactly 1 when accumulated token by token in
    # float32 (each 1 + 2^-24 is a tie that rounds back to 1). Channel 0 =
    # [1, 2^-23, 0...] sums to 1 + 2^-23 either way. Sequential float32 boosts
    # channel 0; a pairwise or float64 sum would boost channel 1.
    k = np.zeros((G, 8), np.float32)
    k[0, 0], k[1, 0] = 1.0, 2.0 ** -23
    k[0, 1], k[1:, 1] = 1.0, tiny
    # ties: channels 4 and 6 have equal |k| sums (6 = -4): 4 wins, not 6
    k[:, 4] = np.linspace(-0.5, 0.25, G).astype(np.float16) / np.float32(1024)
    k[:, 6] = -k[:, 4]
    v = np.ones((G, 8), np.float32)
    for alpha, want in (("0.125", 0), ("0.375", None)):
        js = cli_case(tl, cli, tmp, ref, "kitty", G, 8, 0,
                      ["--sink", "0", "--alpha", alpha], dict(sink=0, alpha=float(alpha)),
                      data=(k, v))
        if want is not None:
            # the oracle's own reading of the bytes: idx[0] == 0 (channel 0 boosted)
            page, _ = ref.key_page_encode(ref.f16r(k), 1)
            tl.check(page[8 * G // 4 + G // 4 + 0] == 0,
                     "oracle: sequential float32 magnitude boosts channel 0")
        else:
            page, _ = ref.key_page_encode(ref.f16r(k), 3)
            tl.check(list(page[8 * G // 4 + 3 * G // 4:][:8]) == [0, 1, 3, 3, 2, 3, 3, 3],
                     "oracle: magnitude tie goes to the lower channel")
    # variance ties and constant channels: every channel constant except two
    # with equal variance (7 = 3 + c): 3 wins
    k2 = np.full((G, 8), 0.5, np.float32)
    k2[:, 3] = np.cos(np.arange(G)).astype(np.float16)
    k2[:, 7] = k2[:, 3] + np.float32(4.0)
    cli_case(tl, cli, tmp, ref, "kitty", G, 8, 0, ["--sink", "0", "--alpha", "0.125",
                                                   "--select", "variance"],
             dict(sink=0, alpha=0.125, select="variance"), data=(k2, v))


# ---------------------------------------------------------------- error paths

def error_paths(tl, cli, tmp):
    k, _ = make_data(40, 64, 5)
    good = os.path.join(tmp, "good.npy")
    write_npy(good, k)
    raw = os.path.join(tmp, "bad.raw")
    with open(raw, "wb") as f:
        f.write(b"\0" * (64 * 4 * 3 + 2))
    wide = os.path.join(tmp, "wide.npy")
    write_npy(wide, np.zeros((10, 32), np.float32))
    nan = os.path.join(tmp, "nan.npy")
    kn = k.copy()
    kn[33, 7] = np.nan
    write_npy(nan, kn)
    empty = os.path.join(tmp, "empty.raw")
    open(empty, "wb").close()
    # .npy headers: float64, Fortran order, an unknown version, a version-2
    # header cut short (a version-2 file itself is accepted, below)
    f64 = os.path.join(tmp, "f64.npy")
    np.save(f64, k.astype(np.float64))
    fort = os.path.join(tmp, "fortran.npy")
    np.save(fort, np.asfortranarray(k))
    v2 = os.path.join(tmp, "v2.npy")
    with open(v2, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(k), version=(2, 0))
    v9, v2cut = os.path.join(tmp, "v9.npy"), os.path.join(tmp, "v2cut.npy")
    data = open(v2, "rb").read()
    open(v9, "wb").write(data[:6] + b"\x09" + data[7:])
    open(v2cut, "wb").write(data[:11])
    rc, out, err = run(cli, ["--method", "kitty", "--head-dim", "64", "--keys", v2])
    tl.check(rc == 0, "a version-2 .npy header is read: exit %d, %r" % (rc, err))
    cases = [
        (".npy of float64", ["--method", "kitty", "--head-dim", "64", "--keys", f64], "float32"),
        (".npy in Fortran order", ["--method", "kitty", "--head-dim", "64", "--keys", fort], "C-ordered"),
        (".npy version 9", ["--method", "kitty", "--head-dim", "64", "--keys", v9], "version"),
        (".npy version-2 header cut", ["--method", "kitty", "--head-dim", "64", "--keys", v2cut],
         "truncated"),
        ("bad file size", ["--method", "kitty", "--head-dim", "64", "--keys", raw]),
        (".npy shape mismatch", ["--method", "kitty", "--head-dim", "64", "--keys", wide]),
        ("unknown method", ["--method", "kitty-max", "--head-dim", "64", "--keys", good]),
        ("alpha 1.5", ["--method", "kitty", "--alpha", "1.5", "--head-dim", "64", "--keys", good]),
        ("alpha nan", ["--method", "kitty", "--alpha", "nan", "--head-dim", "64", "--keys", good]),
        ("head dim 6", ["--method", "kitty", "--head-dim", "6", "--keys", good]),
        ("head dim 260", ["--method", "kitty", "--head-dim", "260", "--keys", good]),
        ("unknown select", ["--method", "kitty", "--select", "loudest", "--head-dim", "64",
                            "--keys", good]),
        ("missing file", ["--method", "kitty", "--head-dim", "64", "--keys",
                          os.path.join(tmp, "nope.npy")]),
        ("NaN in keys", ["--method", "kitty", "--head-dim", "64", "--keys", nan]),
        ("empty keys", ["--method", "kitty", "--head-dim", "64", "--keys", empty]),
        ("values length mismatch", ["--method", "kitty", "--head-dim", "64", "--keys", good,
                                    "--values", wide]),
        ("group 6", ["--method", "kitty", "--group", "6", "--head-dim", "64", "--keys", good]),
        ("pages of fp16", ["--method", "fp16", "--head-dim", "64", "--keys", good,
                           "--out-pages", os.path.join(tmp, "p.bin")]),
    ]
    for what, args, *word in cases:
        rc, out, err = run(cli, args)
        lines = [x for x in err.splitlines() if x.strip()]
        tl.check(rc != 0 and len(lines) == 1 and all(w in err for w in word),
                 "CLI error path '%s': exit %d, %d stderr lines: %r" % (what, rc, len(lines), err))


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer token counts")
    ap.add_argument("--figures", action="store_true",
                    help="print bits/element and relative errors for the report")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if np is None:
        print("numpy missing")
        if os.environ.get("KKV_REQUIRE_ORACLE") == "1":
            print("0 passed, 1 failed")
            return 1
        return 77
    import kitty_ref as ref

    tl = Tally(a.verbose)
    self_checks(tl, ref)
    with tempfile.TemporaryDirectory() as tmp:
        error_paths(tl, a.kittykv, tmp)
        adversarial(tl, a.kittykv, tmp, ref)
        random_select(tl, a.kittykv, tmp)
        Ts = [1, 31, 32, 33, 160, 161, 288, 289, 300, 416, 417, 1000, 4096]
        if a.quick:
            Ts = [1, 33, 161, 289, 1000]
        names = list(ref.METHODS)
        seed = 1
        for D in (64, 128, 12):
            tcount = Ts if D != 12 else [1, 33, 160, 289, 545]
            for T in tcount:
                for name in names:
                    seed += 1
                    cli_case(tl, a.kittykv, tmp, ref, name, T, D, seed)
                seed += 1
                cli_case(tl, a.kittykv, tmp, ref, "kitty", T, D, seed, ["--select", "variance"],
                         dict(select="variance"))
                cli_case(tl, a.kittykv, tmp, ref, "kitty-pro", T, D, seed,
                         ["--select", "variance"], dict(select="variance"))
                cli_case(tl, a.kittykv, tmp, ref, "kitty", T, D, seed, ["--alpha", "0.3"],
                         dict(alpha=0.3))
                cli_case(tl, a.kittykv, tmp, ref, "kitty-pro", T, D, seed, ["--alpha", "0.6"],
                         dict(alpha=0.6), with_values=False)
                cli_case(tl, a.kittykv, tmp, ref, "kivi-k2v2s", T, D, seed, [], None,
                         with_values=False)
                # small pages: many flushes even for short inputs
                cli_case(tl, a.kittykv, tmp, ref, "kitty", T, D, seed,
                         ["--sink", "4", "--group", "8", "--window", "12"],
                         dict(sink=4, group=8, window=12))
                cli_case(tl, a.kittykv, tmp, ref, "kivi-k4v4", T, D, seed,
                         ["--sink", "0", "--group", "4", "--window", "0"],
                         dict(sink=0, group=4, window=0))
                # 8-bit pages with a sink, small pages and eager values leaving a window
                cli_case(tl, a.kittykv, tmp, ref, "kivi-k8v8", T, D, seed,
                         ["--sink", "4", "--group", "8", "--window", "12"],
                         dict(sink=4, group=8, window=12))
                # beyond the paper (docs/FORMAT.md section 5): pairs, clipped ranges
                if T in (33, 289, 417, 1000) or (D == 12 and T == 545):
                    cli_case(tl, a.kittykv, tmp, ref, "kitty:pairs=1", T, D, seed, [],
                             dict(pairs=1))
                    cli_case(tl, a.kittykv, tmp, ref, "kitty-pro:pairs=1:clip=1:vclip=1", T, D,
                             seed, [], dict(pairs=1, clip=1, vclip=1))
                    cli_case(tl, a.kittykv, tmp, ref, "kivi-k4v2s:clip=1", T, D, seed, [],
                             dict(clip=1))
        if a.figures:
            print("\nfigures: 4096 tokens, make_data(extreme=False), with values")
            print("%-11s %4s %10s %12s %12s" % ("method", "D", "bits/elem", "key relerr",
                                                "value relerr"))
            for D in (64, 128):
                for name in names:
                    js = cli_case(tl, a.kittykv, tmp, ref, name, 4096, D, 12345,
                                  extreme=False)
                    if js:
                        print("%-11s %4d %10.4f %12.6f %12.6f" % (
                            name, D, js["bits_per_element"], js["key_rel_err"],
                            js["value_rel_err"]))
    print("%d passed, %d failed" % (tl.passed, tl.failed))
    return 1 if tl.failed else 0


if __name__ == "__main__":
    sys.exit(main())
