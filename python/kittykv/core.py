"""Methods, the quantizer and the paged cache (the core library, kittykv.h)."""
import ctypes
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _lib
from ._errors import InvalidArgument, NonFinite, NotFound, Unsupported, check
from ._handle import Handle

_L = _lib.core

SELECT_NAMES = ("magnitude", "variance", "random", "oracle", "range")  # kkv_select 0..4
KERNEL_NAMES = ("auto", "scalar", "avx2", "avx512", "neon")   # kkv_kernel 0..4


def methods():
    """The named methods, fp16 first (kkv_method_names())."""
    names = _L.kkv_method_names()
    out, i = [], 0
    while names[i] is not None:
        out.append(names[i].decode())
        i += 1
    return out


def _f32(x, what, ndim=None):
    """x as a C-contiguous float32 array: the same memory when it already is
    one (no copy), else a converted copy."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    if ndim is not None and a.ndim != ndim:
        raise InvalidArgument(f"{what}: expected a {ndim}-D array, got shape {a.shape}")
    return a


class Method:
    """A quantization method (kkv_method): a name from methods() with optional
    overrides, e.g. ``Method.parse("kitty:alpha=0.25:select=variance")`` or
    ``Method("kitty", alpha=0.25)``.

    Fields, read-only: ``fp16`` (bool), ``sink``, ``group``, ``window``,
    ``alpha``, ``value_bits``, ``key_bits`` (2, or 8 for 8-bit key pages),
    ``select`` ("magnitude", "variance", "random" or "oracle") and ``seed``. ``str(m)`` is the canonical spec
    (kkv_method_format), which parses back to an equal method.
    """

    __slots__ = ("_m",)

    def __init__(self, spec="kitty", **overrides):
        m = _lib.Method()
        check(_L.kkv_method_parse(ctypes.byref(m), str(spec).encode()))
        if overrides:
            for k, v in overrides.items():
                if k == "vbits":
                    k = "value_bits"
                if k == "kbits":
                    k = "key_bits"
                if k == "select":
                    if v not in SELECT_NAMES:
                        raise InvalidArgument(f"select: '{v}' is not one of {SELECT_NAMES}")
                    v = SELECT_NAMES.index(v)
                if k == "eager":
                    k = "eager_values"
                if k not in ("sink", "group", "window", "alpha", "value_bits", "select",
                             "seed") + (("eager_values",) if _lib.HAS_FORK else ()) + \
                        (_lib.PLUS_FIELDS if _lib.HAS_PLUS else ()) + \
                        (_lib.BUDGET_FIELDS if _lib.HAS_BUDGET else ()) + \
                        (_lib.KEY8_FIELDS if _lib.HAS_KEY8 else ()):
                    raise InvalidArgument(f"Method: unknown field '{k}'")
                setattr(m, k, v)
            # the library's own rules decide what is consistent: format what we
            # have and parse it again
            text = _format(m)
            m = _lib.Method()
            check(_L.kkv_method_parse(ctypes.byref(m), text.encode()), "Method")
        self._m = m

    @classmethod
    def parse(cls, spec):
        """Parses a method spec (kkv_method_parse); raises NotFound for an
        unknown name, InvalidArgument for a bad override."""
        return cls(spec)

    @classmethod
    def _wrap(cls, m):
        self = cls.__new__(cls)
        self._m = _lib.Method.from_buffer_copy(m)
        return self

    fp16 = property(lambda self: bool(self._m.fp16))
    sink = property(lambda self: self._m.sink)
    group = property(lambda self: self._m.group)
    window = property(lambda self: self._m.window)
    alpha = property(lambda self: float(self._m.alpha))
    value_bits = property(lambda self: self._m.value_bits)
    # 2 (the boosted 2/4-bit key pages) or 8; 2 in libraries without 8-bit keys
    key_bits = property(lambda self: 8 if getattr(self._m, "key_bits", 2) == 8 else 2)
    select = property(lambda self: SELECT_NAMES[self._m.select])
    seed = property(lambda self: int(self._m.seed))
    # eager value quantization (spec key eager=1), in libraries that have it
    eager_values = property(lambda self: bool(getattr(self._m, "eager_values", 0)))

    def replace(self, **overrides):
        """A copy with some fields changed (sink, group, window, alpha,
        value_bits, select, seed; eager_values where the library has it),
        checked like a parsed spec."""
        return Method(str(self), **overrides)

    def check(self, head_dim):
        """Raises InvalidArgument if the method cannot serve this head dimension."""
        check(_L.kkv_method_check(ctypes.byref(self._m), int(head_dim)))

    def boost(self, head_dim):
        """Boosted key channels per page for this head dimension."""
        return _L.kkv_method_boost(ctypes.byref(self._m), int(head_dim))

    def _key(self):
        m = self._m
        # every field the library has (key_bits 0 reads as 2)
        return tuple(self.key_bits if f == "key_bits" else getattr(m, f) for f, _ in m._fields_)

    def __eq__(self, other):
        return isinstance(other, Method) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self):
        return _format(self._m)

    def __repr__(self):
        return f"kittykv.Method({str(self)!r})"


def _format(m):
    buf = ctypes.create_string_buffer(256)
    check(_L.kkv_method_format(buf, len(buf), None, ctypes.byref(m)))
    return buf.value.decode()


def as_method(method):
    """A Method from a Method or a spec string."""
    return method if isinstance(method, Method) else Method.parse(method)


def _fingerprint(model):
    """The model's kkv_model_fingerprint, or 0 for None."""
    return 0 if model is None else model.fingerprint


def _mem_dict(mem):
    d = {f: int(getattr(mem, f)) for f in _lib.MEM_FIELDS}
    d["bits_per_element"] = float(mem.bits_per_element)
    for f in _lib.MEM_EXTRA:
        d[f] = int(getattr(mem, f))
    return d


# ------------------------------------------------------------------ quantize

@dataclass
class Quantized:
    """What kittykv.quantize() returns.

    keys, values: [T][D] float32, the keys and values as attention sees them
    (values is None when none were given); bytes: stored bytes by component
    (key_lo, key_hi, key_idx, key_meta, value_codes, value_meta, fp16, total);
    bits_per_element: 8 * total / elements (keys only without values);
    n_boost: boosted channels per key page; method: the Method used."""
    keys: np.ndarray
    values: Optional[np.ndarray]
    bytes: dict
    bits_per_element: float
    n_boost: int
    method: Method


def quantize(keys, values=None, method="kitty"):
    """Pushes the keys (and values) of one head through a method's token
    lifecycle and returns them as attention sees them after the last step,
    with the stored bytes by component: exactly what ``kittykv quantize
    --out-keys/--out-values --json`` computes, on a one-layer one-head cache,
    one token at a time (append, then flush).

    keys, values: [T][D] array-likes (float32 arrays are read in place).
    method: a Method or a spec string. Without values, values are left out of
    every figure."""
    m = as_method(method)
    k = _f32(keys, "keys", 2)
    T, D = k.shape
    m.check(D)
    v = None
    if values is not None:
        v = _f32(values, "values", 2)
        if v.shape != k.shape:
            raise InvalidArgument(f"values have shape {v.shape}, keys {k.shape}")
    if T == 0:
        raise InvalidArgument("keys hold no tokens")
    mm = m._m
    # room for every page of T tokens plus the staging area (as the CLI sizes it)
    page = 4 * mm.group * D + 8 * D + 8 * mm.group
    pool = (T // mm.group + 2) * page + (2 * mm.sink + 2 * mm.group + mm.window) * D * 2
    zero = np.zeros(D, np.float32)  # [D] values when none are given
    row = D * 4
    with Cache(1, 1, D, m, pool) as c, c._use() as cp:
        seq = c.add_sequence()
        kp = k.ctypes.data
        vp = v.ctypes.data if v is not None else None
        for t in range(T):
            check(_L.kkv_append(cp, 0, 0, kp + t * row,
                                vp + t * row if vp is not None else zero.ctypes.data),
                  "quantize")
            check(_L.kkv_flush(cp, 0, 0), "quantize")
        ko, vo = c.read(seq, 0, 0, values=v is not None)
        mem = c._mem_struct(seq)
        info = c.info(seq, 0)
    b = {f: int(getattr(mem, f)) for f in ("key_lo", "key_hi", "key_idx", "key_meta",
                                           "value_codes", "value_meta", "fp16", "total")}
    if hasattr(mem, "sink_int8"):
        b["sink_int8"] = int(mem.sink_int8)
    if v is None:
        # keys alone: drop value pages and the fp16 values from the figures
        sink8 = bool(getattr(mm, "sink_int8", 0)) and not m.fp16  # int8 sink rows
        fp16_keys = ((0 if sink8 else info["sink"]) + info["key_buffer"]) * D * 2
        if m.fp16:
            fp16_keys += info["key_pages"] * mm.group * D * 2
        b["fp16"] = fp16_keys
        b["value_codes"] = b["value_meta"] = 0
        if "sink_int8" in b:
            b["sink_int8"] = info["sink"] * (D + 2) if sink8 else 0
        b["total"] = b["key_lo"] + b["key_hi"] + b["key_idx"] + b["key_meta"] + b["fp16"] + \
            b.get("sink_int8", 0)
    elems = float(T * D * (2 if v is not None else 1))
    return Quantized(keys=ko, values=vo, bytes=b, bits_per_element=8.0 * b["total"] / elems,
                     n_boost=m.boost(D), method=m)


# ------------------------------------------------------------------ cache

class Cache(Handle):
    """A paged KV cache (kkv_cache) for one model shape and one method.

    ``Cache(n_layers, n_kv_heads, head_dim, method, pool_bytes)`` reserves a pool
    of pool_bytes for pages and per-sequence staging. Sequences are integer
    ids from add_sequence(). Per token and layer: append(), attend(), then
    flush() (docs/FORMAT.md section 3). Free it with close() or a with-block;
    afterwards every call raises ClosedError. Not for two threads at once
    (calls on one cache are serialized)."""

    _kind = "cache"

    def __init__(self, n_layers, n_kv_heads, head_dim, method="kitty", pool_bytes=64 << 20,
                 *, max_seqs=0, max_tokens=0, n_threads=0):
        super().__init__()
        cfg = _lib.CacheConfig(n_layers=int(n_layers), n_kv_heads=int(n_kv_heads),
                               head_dim=int(head_dim), pool_bytes=int(pool_bytes),
                               max_seqs=int(max_seqs), max_tokens=int(max_tokens),
                               n_threads=int(n_threads))
        cfg.method = as_method(method)._m
        self._create(cfg)

    @classmethod
    def _from_config(cls, cfg):
        self = cls.__new__(cls)
        Handle.__init__(self)
        self._create(cfg)
        return self

    def _create(self, cfg):
        p = ctypes.c_void_p()
        check(_L.kkv_cache_create(ctypes.byref(p), ctypes.byref(cfg)), "Cache")
        self._adopt(p.value)
        c = _L.kkv_cache_get_config(p.value).contents
        self._cfg = _lib.CacheConfig.from_buffer_copy(c)

    def _free(self, ptr):
        _L.kkv_cache_free(ptr)

    # -- shape and configuration
    n_layers = property(lambda self: self._cfg.n_layers)
    n_kv_heads = property(lambda self: self._cfg.n_kv_heads)
    head_dim = property(lambda self: self._cfg.head_dim)
    pool_bytes = property(lambda self: int(self._cfg.pool_bytes))

    @property
    def method(self):
        """The cache's Method."""
        return Method._wrap(self._cfg.method)

    @property
    def config(self):
        """The configuration, as a dict (method as a Method)."""
        c = self._cfg
        return {"n_layers": c.n_layers, "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
                "pool_bytes": int(c.pool_bytes), "max_seqs": c.max_seqs,
                "max_tokens": c.max_tokens, "n_threads": c.n_threads, "method": self.method}

    @property
    def kernel(self):
        """The attention kernel in use ("scalar", "avx2", "avx512"); assign a
        name to change it (Unsupported if this CPU lacks it)."""
        with self._use() as c:
            return _L.kkv_kernel_name(_L.kkv_cache_get_kernel(c)).decode()

    @kernel.setter
    def kernel(self, name):
        if name not in KERNEL_NAMES:
            raise InvalidArgument(f"kernel: '{name}' is not one of {KERNEL_NAMES}")
        with self._use() as c:
            check(_L.kkv_cache_set_kernel(c, KERNEL_NAMES.index(name)), "kernel")

    # -- sequences
    def add_sequence(self):
        """Adds an empty sequence and returns its id (the lowest free one).
        PoolFull if its staging does not fit or every id is taken."""
        s = ctypes.c_int()
        with self._use() as c:
            check(_L.kkv_seq_add(c, ctypes.byref(s)), "add_sequence")
        return s.value

    def free_sequence(self, seq):
        """Frees a sequence; its pages return to the pool."""
        with self._use() as c:
            check(_L.kkv_seq_free(c, int(seq)), "free_sequence")

    def fork(self, seq):
        """A new sequence holding exactly what seq holds (pages shared, not
        copied); returns its id. Unsupported if this library has no
        kkv_seq_fork."""
        if _lib.seq_fork is None:
            raise Unsupported("fork: this build of libkittykv has no kkv_seq_fork")
        s = ctypes.c_int()
        with self._use() as c:
            check(_lib.seq_fork(c, ctypes.byref(s), int(seq)), "fork")
        return s.value

    def save(self, seq, path=None, *, tokens=None, model=None):
        """Saves sequence seq (kkv_seq_save; docs/STATE_FORMAT.md): to the file
        at path (written whole, then renamed into place), or, without path,
        returned as bytes. tokens: the ids the sequence holds, stored with it;
        model: a Model whose fingerprint the state records (load then refuses
        states of other models). Unsupported without kkv_seq_save."""
        if _lib.seq_save is None:
            raise Unsupported("save: this build of libkittykv has no kkv_seq_save")
        t = np.ascontiguousarray(tokens if tokens is not None else [], dtype=np.int32)
        meta = _lib.StateMeta(model_fingerprint=_fingerprint(model),
                              tokens=t.ctypes.data if len(t) else None, n_tokens=len(t))
        with self._use() as c:
            if path is not None:
                check(_lib.seq_save_file(c, os.fsencode(path), int(seq), ctypes.byref(meta)),
                      "save")
                return None
            n = ctypes.c_size_t()
            check(_lib.seq_save(c, None, 0, ctypes.byref(n), int(seq), ctypes.byref(meta)),
                  "save")
            buf = ctypes.create_string_buffer(n.value)
            check(_lib.seq_save(c, buf, n.value, ctypes.byref(n), int(seq),
                                ctypes.byref(meta)), "save")
        return buf.raw[:n.value]

    def load(self, state, *, model=None):
        """Adds a sequence from a saved state: bytes-like (read in place) or a
        path. Returns (seq, tokens), tokens the int32 ids saved with it. The
        state must have this cache's method and shape (and model's
        fingerprint if given): FormatError otherwise, or for any corruption;
        the cache is then as it was."""
        if _lib.seq_load is None:
            raise Unsupported("load: this build of libkittykv has no kkv_seq_load")
        fp = _fingerprint(model)
        is_path = isinstance(state, (str, os.PathLike))
        data = None if is_path else np.frombuffer(state, dtype=np.uint8)
        seq, nt = ctypes.c_int(), ctypes.c_int()
        toks = np.zeros(1, np.int32)  # grown below if the state holds more ids
        with self._use() as c:
            def attempt(toks):
                if is_path:
                    return _lib.seq_load_file(c, ctypes.byref(seq), os.fsencode(state), fp,
                                              toks.ctypes.data, len(toks), ctypes.byref(nt))
                return _lib.seq_load(c, ctypes.byref(seq), data.ctypes.data, data.size, fp,
                                     toks.ctypes.data, len(toks), ctypes.byref(nt))
            s = attempt(toks)
            if s != 0 and nt.value > len(toks):  # nothing was added: room for the ids
                toks = np.zeros(nt.value, np.int32)
                s = attempt(toks)
            check(s, "load")
        return seq.value, toks[:nt.value].copy()

    def seq_len(self, seq, layer=0):
        """Tokens appended to one layer of a sequence."""
        with self._use() as c:
            n = _L.kkv_seq_len(c, int(seq), int(layer))
        if n < 0:
            raise NotFound(f"seq_len: no sequence {seq} or layer {layer}")
        return n

    def reserve(self, seq, n_tokens):
        """Allocates now the pages n_tokens more tokens on every layer will
        need; all or nothing (PoolFull leaves the cache as it was)."""
        with self._use() as c:
            check(_L.kkv_seq_reserve(c, int(seq), int(n_tokens)), "reserve")

    # -- the token lifecycle
    def _heads(self, x, what):
        a = _f32(x, what)
        H, D = self._cfg.n_kv_heads, self._cfg.head_dim
        if a.shape not in ((H, D),) + (((D,),) if H == 1 else ()):
            raise InvalidArgument(f"{what}: expected shape ({H}, {D}), got {a.shape}")
        return a

    def append(self, seq, layer, k, v):
        """Appends one token's key and value for one layer, all KV heads.
        k, v: [n_kv_heads][head_dim] ([head_dim] with one head); k post-RoPE.
        NonFinite (nothing stored) for NaN or Inf."""
        k = self._heads(k, "k")
        v = self._heads(v, "v")
        with self._use() as c:
            check(_L.kkv_append(c, int(seq), int(layer), k.ctypes.data, v.ctypes.data),
                  "append")

    def flush(self, seq, layer):
        """Quantizes any full key or value Q-buffer of (seq, layer) into pages;
        call it after the step's attend()."""
        with self._use() as c:
            check(_L.kkv_flush(c, int(seq), int(layer)), "flush")

    def extend(self, seq, layer, keys, values):
        """append() then flush() for each of T tokens: keys, values
        [T][n_kv_heads][head_dim] ([T][head_dim] with one head). NaN or Inf
        anywhere raises NonFinite before anything is stored; another failure
        (PoolFull, ContextFull) keeps the tokens before the failing one."""
        H, D = self._cfg.n_kv_heads, self._cfg.head_dim
        k, v = _f32(keys, "keys"), _f32(values, "values")
        for name, a in (("keys", k), ("values", v)):
            if not ((a.ndim == 3 and a.shape[1:] == (H, D)) or
                    (a.ndim == 2 and H == 1 and a.shape[1] == D)):
                raise InvalidArgument(f"extend: {name} must be [T][{H}][{D}], got {a.shape}")
        if k.shape[0] != v.shape[0]:
            raise InvalidArgument(f"extend: {k.shape[0]} keys but {v.shape[0]} values")
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise NonFinite("extend: NaN or Inf in keys or values; nothing stored")
        row = H * D * 4
        with self._use() as c:
            for t in range(k.shape[0]):
                check(_L.kkv_append(c, int(seq), int(layer), k.ctypes.data + t * row,
                                    v.ctypes.data + t * row), "extend")
                check(_L.kkv_flush(c, int(seq), int(layer)), "extend")

    def attend(self, seq, layer, q):
        """Decode attention of n_q query heads over everything cached for
        (seq, layer), fused over the quantized pages: softmax(q.k/sqrt(D)) v.
        q: [n_q][head_dim] with n_q a multiple of n_kv_heads (or [head_dim]
        for one head). Returns a new float32 array of q's shape."""
        D = self._cfg.head_dim
        qa = _f32(q, "q")
        if qa.ndim not in (1, 2) or qa.shape[-1] != D:
            raise InvalidArgument(f"attend: q must be [n_q][{D}] or [{D}], got {qa.shape}")
        n_q = 1 if qa.ndim == 1 else qa.shape[0]
        out = np.empty(qa.shape, np.float32)  # [n_q][D]
        with self._use() as c:
            check(_L.kkv_attend(c, out.ctypes.data, int(seq), int(layer), qa.ctypes.data,
                                n_q), "attend")
        return out

    def attend_batch(self, seqs, layer, q):
        """attend() of several sequences of one layer in one parallel pass (a
        decode step's batch). seqs: n sequence ids (may repeat); q:
        [n][n_q][head_dim]. Returns [n][n_q][head_dim], block i equal to
        attend(seqs[i], layer, q[i]) bit for bit."""
        if _lib.attend_batch is None:
            raise Unsupported("attend_batch: this build of libkittykv has no kkv_attend_batch")
        D = self._cfg.head_dim
        sa = np.ascontiguousarray(seqs, dtype=np.int32)
        qa = _f32(q, "q")
        if sa.ndim != 1 or sa.size < 1:
            raise InvalidArgument("attend_batch: seqs must be a non-empty 1-D list")
        if qa.ndim != 3 or qa.shape[0] != sa.size or qa.shape[2] != D:
            raise InvalidArgument(f"attend_batch: q must be [{sa.size}][n_q][{D}], got {qa.shape}")
        out = np.empty(qa.shape, np.float32)  # [n][n_q][D]
        with self._use() as c:
            check(_lib.attend_batch(c, out.ctypes.data, sa.ctypes.data, int(sa.size), int(layer),
                                    qa.ctypes.data, qa.shape[1]), "attend_batch")
        return out

    def set_rank(self, layer, head, rank):
        """Channel ranking for select=oracle methods: a permutation of
        0..head_dim-1, most important first."""
        r = np.ascontiguousarray(rank, dtype=np.uint8)
        if r.shape != (self._cfg.head_dim,):
            raise InvalidArgument(f"set_rank: expected {self._cfg.head_dim} channels")
        with self._use() as c:
            check(_L.kkv_cache_set_rank(c, int(layer), int(head),
                                        r.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))),
                  "set_rank")

    # -- reading back
    def read(self, seq, layer, head, keys=True, values=True):
        """The keys and values of (seq, layer, head) exactly as attention sees
        them: a pair of [n][head_dim] float32 arrays (None where not asked)."""
        D = self._cfg.head_dim
        with self._use() as c:
            n = _L.kkv_seq_len(c, int(seq), int(layer))
            if n < 0:
                raise NotFound(f"read: no sequence {seq} or layer {layer}")
            k = np.empty((n, D), np.float32) if keys else None  # [n][D]
            v = np.empty((n, D), np.float32) if values else None  # [n][D]
            check(_L.kkv_seq_read(c, k.ctypes.data if keys else None,
                                  v.ctypes.data if values else None, int(seq), int(layer),
                                  int(head)), "read")
        return k, v

    def info(self, seq, layer=0):
        """Where the tokens of one layer are: len, sink, key_pages,
        value_pages, key_buffer, value_tail (kkv_seq_info)."""
        si = _lib.SeqInfo()
        with self._use() as c:
            check(_L.kkv_seq_get_info(c, ctypes.byref(si), int(seq), int(layer)), "info")
        return {f: getattr(si, f) for f, _ in _lib.SeqInfo._fields_}

    def key_page(self, seq, layer, head, page):
        """Key page `page` of (seq, layer, head) in the page format of
        kittykv.h, as a uint8 array."""
        m = self._cfg.method
        D = self._cfg.head_dim
        with self._use() as c:
            # a pooled budget (budget=head|err) gives each page its own n_boost
            nb = (_L.kkv_seq_key_page_boost(c, int(seq), int(layer), int(head), int(page))
                  if _lib.HAS_BUDGET else -1)
        if nb < 0:
            nb = _L.kkv_method_boost(ctypes.byref(m), D)
        if _lib.HAS_KEY8:  # the method's own page format (8-bit keys too)
            n = _L.kkv_method_key_page_bytes(ctypes.byref(m), D, nb)
        else:
            n = _L.kkv_key_page_bytes(D, m.group, nb)
        buf = np.empty(n, np.uint8)
        with self._use() as c:
            check(_L.kkv_seq_key_page(c, buf.ctypes.data, n, int(seq), int(layer), int(head),
                                      int(page)), "key_page")
        return buf

    def _mem_struct(self, seq=None):
        mem = _lib.Mem()
        with self._use() as c:
            if seq is None:
                check(_L.kkv_cache_mem(c, ctypes.byref(mem)), "mem")
            else:
                check(_L.kkv_seq_mem(c, ctypes.byref(mem), int(seq)), "mem")
        return mem

    def mem(self, seq=None):
        """Bytes actually stored, by component (kkv_mem as a dict): of one
        sequence, or of the whole pool when seq is None (capacity = budget)."""
        return _mem_dict(self._mem_struct(seq))

    @property
    def free_bytes(self):
        """Bytes the pool still has free."""
        with self._use() as c:
            return int(_L.kkv_cache_free_bytes(c))

    def __repr__(self):
        state = "closed" if self.closed else f"{self.pool_bytes} pool bytes"
        return (f"<kittykv.Cache {self.n_layers}x{self.n_kv_heads}x{self.head_dim} "
                f"{self.method} {state}>")
