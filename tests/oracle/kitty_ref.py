"""Independent numpy reference of the Kitty KV cache, docs/FORMAT.md sections 1-3
(docs/FORMAT.md), for ONE KV head of one layer of one sequence.

Written from the spec, not from the C code. The conventions the spec leaves to
kittykv and that this file fixes (they are the project's binding choices):
  * every key/value is first stored as fp16 (round to nearest even; finite
    values beyond +-65504 clamp to +-65504), and pages are made from those
    stored values;
  * scale = (mx - mn) / (2^b - 1) is computed in float32 and then stored as
    fp16 (same rounding and clamp); mn is stored as fp16 too;
  * q = clip(floor((x - mn16) / scale16 + 0.5), 0, 2^b - 1) in float32, with
    q = 0 when scale16 == 0; decode x' = q * scale16 + mn16 in float32 (two
    roundings, no fused multiply-add);
  * magnitude score_j = sum_t |k[t][j]| accumulated in float32 in token order
    (the mean's 1/G factor does not change the ranking); variance score_j is
    two-pass float32: mean = (sequential sum) / G, then the sequential sum of
    squared deviations; top-k by descending score, ties to the lower index;
  * n_boost = round(alpha * D) with halves rounded up (alpha as float32).
"""
import math

import numpy as np

F16_MAX = np.float32(65504.0)
METHODS = {
    # name: (fp16, sink, alpha, value_bits); G = R = 128 for all (docs/FORMAT.md section 1)
    "fp16": (True, 0, 0.0, 2),
    "kivi-k2v2": (False, 0, 0.0, 2),
    "kivi-k2v2s": (False, 32, 0.0, 2),
    "kivi-k4v2s": (False, 32, 1.0, 2),
    "kivi-k2v4s": (False, 32, 0.0, 4),
    "kivi-k4v4": (False, 0, 1.0, 4),
    "kitty": (False, 32, 0.125, 2),
    "kitty-pro": (False, 32, 0.25, 2),
    # 8-bit keys and values, eager, no window (key_bits 8: FORMAT.md section 2)
    "kivi-k8v8": (False, 0, 0.0, 8),
}
# fields beyond (fp16, sink, alpha, value_bits) where a method differs from the paper's
METHOD_EXTRA = {"kivi-k8v8": dict(window=0, eager=1, key_bits=8)}


class Method:
    def __init__(self, name, alpha=None, select="magnitude", sink=None, group=128, window=None,
                 pairs=0, clip=0, vclip=0, eager=None):
        # a spec "kitty:pairs=1:..." names its base method before the first ':'
        # (the options themselves come as keywords)
        base = name.split(":")[0]
        fp16, s, a, vb = METHODS[base]
        extra = METHOD_EXTRA.get(base, {})
        self.key_bits = extra.get("key_bits", 2)
        self.eager = extra.get("eager", 0) if eager is None else eager
        if window is None:
            window = extra.get("window", 128)
        self.name = name
        self.pairs = pairs  # docs/FORMAT.md section 5, adjacent RoPE pairs over all D
        self.clip = clip
        self.vclip = vclip
        self.fp16 = fp16
        self.sink = s if sink is None else sink
        self.group = group
        self.window = window
        self.alpha = a if alpha is None else alpha
        self.value_bits = vb
        self.select = select

    def n_boost(self, D):
        if self.fp16 or self.key_bits == 8:
            return 0
        a = float(np.float32(self.alpha))
        return int(math.floor(a * D + 0.5))


# ---------------------------------------------------------------- fp16 storage

def f16(x):
    """float -> stored fp16 (clamped, round to nearest even), as float16 array."""
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16)


def f16r(x):
    """The float32 value x becomes after a trip through fp16 storage."""
    return f16(x).astype(np.float32)


# ---------------------------------------------------------------- section 3

def qparams(mn, mx, bits):
    """mn, mx: float32 arrays of group minima/maxima (already fp16-exact).
    Returns (scale16, mn16) as float16 arrays."""
    maxq = np.float32((1 << bits) - 1)
    with np.errstate(over="ignore"):
        scale = (np.asarray(mx, np.float32) - np.asarray(mn, np.float32)) / maxq
    return f16(scale), f16(mn)


def quantize(x, scale16, mn16, bits):
    """x: float32 array, broadcast against scale16/mn16. Returns uint8 codes."""
    x = np.asarray(x, np.float32)
    s = np.asarray(scale16, np.float16).astype(np.float32)
    m = np.asarray(mn16, np.float16).astype(np.float32)
    s_b = np.broadcast_to(s, x.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.floor((x - m) / s + np.float32(0.5))
    y = np.where(s_b == 0, np.float32(0), y)
    q = np.clip(y, 0, (1 << bits) - 1)
    return q.astype(np.uint8)


def dequantize(q, scale16, mn16):
    s = np.asarray(scale16, np.float16).astype(np.float32)
    m = np.asarray(mn16, np.float16).astype(np.float32)
    return (q.astype(np.float32) * s).astype(np.float32) + m


# ---------------------------------------------------------------- section 4

def channel_scores(k, select):
    """k: [G][D] fp16-exact float32. Sequential float32 accumulation over tokens."""
    G, D = k.shape
    acc = np.zeros(D, np.float32)
    if select == "magnitude":
        for t in range(G):
            acc = acc + np.abs(k[t])
        return acc
    if select == "variance":
        for t in range(G):
            acc = acc + k[t]
        mean = acc / np.float32(G)
        dev = np.zeros(D, np.float32)
        for t in range(G):
            d = k[t] - mean
            dev = dev + d * d
        return dev
    raise ValueError("oracle has no selection %r" % select)


def rank_channels(k, select, pairs=0):
    """Channels from most to least important; ties to the lower index. With
    pairs (docs/FORMAT.md section 5, adjacent layout 2i, 2i+1): pairs ranked
    by the float32 sum of their scores, ties to the lower pair, both channels
    emitted together, the higher-scored first (a tie: the lower)."""
    score = channel_scores(k, select)
    if not pairs:
        return np.argsort(-score, kind="stable")
    ps = (score[0::2] + score[1::2]).astype(np.float32)
    out = []
    for i in np.argsort(-ps, kind="stable"):
        a, b = 2 * int(i), 2 * int(i) + 1
        out += [b, a] if score[b] > score[a] else [a, b]
    return np.array(out)


def search_range(x, mn, mx, bits):
    """clip=1 (docs/FORMAT.md section 5): of the ranges [mn + a d, mx - b d],
    d = (mx - mn) / (16 or 64), a, b in 0..7, a + b <= 10, the one with the
    least squared error (double, summed in order) of the decoded fp16
    parameters; ties keep the earlier (min/max first). x: float32 [n]."""
    s16, m16 = qparams(mn, mx, bits)
    if not mx > mn:
        return s16, m16

    def err(s16, m16):
        dec = dequantize(quantize(x, s16, m16, bits), s16, m16)
        d = (x - dec).astype(np.float32).astype(np.float64)
        return np.cumsum(d * d)[-1]

    best, be = (s16, m16), err(s16, m16)
    d = np.float32(mx - mn) / np.float32(16.0 if bits == 2 else 64.0)
    for a in range(8):
        for b in range(8):
            if a + b > 10 or (a == 0 and b == 0):
                continue
            lo = np.float32(mn + np.float32(a) * d)
            hi = np.float32(mx - np.float32(b) * d)
            c = qparams(lo, hi, bits)
            e = err(*c)
            if e < be:
                best, be = c, e
    return best


# ---------------------------------------------------------------- section 5

def pack2_rows(codes):
    """codes: [rows][n] values 0..3, n % 4 == 0 -> [rows][n/4] bytes, element i
    at bits 2*(i%4)."""
    c = codes.astype(np.uint8).reshape(codes.shape[0], -1, 4)
    return (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).astype(np.uint8)


def pack4_rows(codes):
    c = codes.astype(np.uint8).reshape(codes.shape[0], -1, 2)
    return (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)


def key_page_bytes(D, G, nb):
    return D * G // 4 + nb * G // 4 + D + 4 * D


def value_page_bytes(D, G, bits):
    return G * D * bits // 8 + 4 * G


def key8_page_bytes(D, G):
    return D * G + 4 * D


def key8_page_encode(k):
    """8-bit key page: k [G][D] fp16-exact float32, per channel min/max over
    the page, codes [D][G] one byte each. Returns (page bytes, decoded)."""
    scale16, mn16 = qparams(k.min(axis=0), k.max(axis=0), 8)
    q = quantize(k, scale16[None, :], mn16[None, :], 8)  # [G][D]
    page = q.T.astype(np.uint8).tobytes() + scale16.astype("<f2").tobytes() + \
        mn16.astype("<f2").tobytes()
    assert len(page) == key8_page_bytes(*k.shape[::-1])
    return page, dequantize(q, scale16[None, :], mn16[None, :])


def key_page_encode(k, nb, select="magnitude", pairs=0, clip=0):
    """k: [G][D] fp16-exact float32. Returns (page bytes, decoded [G][D])."""
    G, D = k.shape
    order = rank_channels(k, select, pairs)
    idx = np.full(D, nb, np.int64)
    idx[order[:nb]] = np.arange(nb)
    boosted = idx < nb
    mn, mx = k.min(axis=0), k.max(axis=0)
    s2, m2 = qparams(mn, mx, 2)
    s4, m4 = qparams(mn, mx, 4)
    scale16 = np.where(boosted, s4, s2)
    mn16 = np.where(boosted, m4, m2)
    for j in range(D) if clip else ():
        scale16[j], mn16[j] = search_range(k[:, j], mn[j], mx[j], 4 if boosted[j] else 2)
    q = np.empty((D, G), np.uint8)  # [channel][token]
    for j in range(D):
        q[j] = quantize(k[:, j], scale16[j], mn16[j], 4 if boosted[j] else 2)
    lo = pack2_rows(q & 3)
    hi = np.zeros((nb, G // 4), np.uint8)
    for r in range(nb):
        hi[r] = pack2_rows((q[order[r]] >> 2)[None, :])[0]
    page = b"".join([lo.tobytes(), hi.tobytes(), idx.astype(np.uint8).tobytes(),
                     scale16.astype("<f2").tobytes(), mn16.astype("<f2").tobytes()])
    assert len(page) == key_page_bytes(D, G, nb)
    dec = dequantize(q.T, scale16[None, :], mn16[None, :])
    return page, dec


def value_page_encode(v, bits, clip=0):
    """v: [G][D] fp16-exact float32. Returns (page bytes, decoded [G][D])."""
    G, D = v.shape
    scale16, mn16 = qparams(v.min(axis=1), v.max(axis=1), bits)
    for t in range(G) if clip else ():
        scale16[t], mn16[t] = search_range(v[t], v[t].min(), v[t].max(), bits)
    q = quantize(v, scale16[:, None], mn16[:, None], bits)
    codes = pack2_rows(q) if bits == 2 else pack4_rows(q) if bits == 4 else q.astype(np.uint8)
    page = codes.tobytes() + scale16.astype("<f2").tobytes() + mn16.astype("<f2").tobytes()
    assert len(page) == value_page_bytes(D, G, bits)
    return page, dequantize(q, scale16[:, None], mn16[:, None])


# ---------------------------------------------------------------- section 6

def lifecycle(m, keys, values=None):
    """Pushes T tokens of one head through append -> flush, one at a time.
    keys, values: [T][D] float32 (values may be None: keys-only figures).
    Returns dict: keys/values as attention sees them ([T][D] float32), the key
    pages (list of bytes), and the byte counts by component."""
    keys = np.asarray(keys, np.float32)
    T, D = keys.shape
    G, R = m.group, m.window
    k16 = f16r(keys)
    v16 = f16r(values) if values is not None else None
    b = dict(key_lo=0, key_hi=0, key_idx=0, key_meta=0, value_codes=0, value_meta=0, fp16=0,
             sink_int8=0)
    n_val = 0 if values is None else 1
    if m.fp16:
        b["fp16"] = T * D * 2 * (1 + n_val)
        b["total"] = b["fp16"]
        return dict(keys=k16, values=v16, pages=[], bytes=b, n_boost=0)
    S = m.sink
    nb = m.n_boost(D)
    sink = min(T, S)
    n = T - sink
    kp = n // G
    ktail = n - kp * G
    vp = max(0, n - R) // G
    # eager: every value out of the window is quantized (a row is its own group)
    vq = max(0, n - R) if m.eager else vp * G
    vtail = n - vq
    kout = k16.copy()
    pages = []
    for p in range(kp):
        a = sink + p * G
        if m.key_bits == 8:
            page, dec = key8_page_encode(k16[a:a + G])
        else:
            page, dec = key_page_encode(k16[a:a + G], nb, m.select, m.pairs, m.clip)
        pages.append(page)
        kout[a:a + G] = dec
    vout = None
    if values is not None:
        vout = v16.copy()
        if vq:
            _, dec = value_page_encode(v16[sink:sink + vq], m.value_bits, m.vclip)
            vout[sink:sink + vq] = dec
    if m.key_bits == 8:
        b["key_lo"] = kp * D * G
    else:
        b["key_lo"] = kp * D * G // 4
        b["key_hi"] = kp * nb * G // 4
        b["key_idx"] = kp * D
    b["key_meta"] = kp * 4 * D
    b["fp16"] = (sink + ktail) * D * 2
    if values is not None:
        b["value_codes"] = vq * D * m.value_bits // 8
        b["value_meta"] = vq * 4
        b["fp16"] += (sink + vtail) * D * 2
    b["total"] = sum(b[c] for c in ("key_lo", "key_hi", "key_idx", "key_meta",
                                    "value_codes", "value_meta", "fp16"))
    return dict(keys=kout, values=vout, pages=pages, bytes=b, n_boost=nb,
                counts=dict(sink=sink, kp=kp, ktail=ktail, vp=vp, vtail=vtail))
