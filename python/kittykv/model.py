"""The GGUF engine (kittykv_model.h) and evaluation (kittykv_eval.h)."""
import ctypes
import os

import numpy as np

from . import _lib
from ._errors import InvalidArgument, Unsupported, check
from ._handle import Handle
from .core import Cache, Method, _mem_dict, as_method
from .core import methods as _method_names

_M = _lib.model
_E = _lib.evl



def chat_templates():
    """The chat template families the library applies (chatml, llama3, ...)."""
    names = _M.kkv_chat_template_names()
    out, i = [], 0
    while names[i] is not None:
        out.append(names[i].decode())
        i += 1
    return out


def _i32(tokens, what):
    a = np.ascontiguousarray(tokens, dtype=np.int32)
    if a.ndim != 1:
        raise InvalidArgument(f"{what}: expected a 1-D sequence of token ids, got {a.shape}")
    return a


class _Sampler(Handle):
    _kind = "sampler"

    def __init__(self, params):
        super().__init__()
        p = ctypes.c_void_p()
        check(_M.kkv_sampler_create(ctypes.byref(p), ctypes.byref(params)), "sampler")
        self._adopt(p.value)

    def _free(self, ptr):
        _M.kkv_sampler_free(ptr)


class Model(Handle):
    """A GGUF Llama-family model (kkv_model), memory-mapped.

    ``Model(path)`` loads it; path None means $KKV_MODEL. n_threads: matmul
    threads (0: all cores). vocab_only: load only the tokenizer (tokenize and
    detokenize work, forward passes raise). Free with close() or a
    with-block; afterwards every call raises ClosedError."""

    _kind = "model"

    def __init__(self, path=None, n_threads=0, *, vocab_only=False, exact_matmul=False):
        super().__init__()
        if path is None:
            path = os.environ.get("KKV_MODEL")
            if not path:
                raise InvalidArgument("Model: no path given and KKV_MODEL is not set")
        self.path = os.fspath(path)
        p = ctypes.c_void_p()
        if vocab_only:
            check(_M.kkv_model_load_vocab(ctypes.byref(p), self.path.encode(), None), "Model")
        else:
            check(_M.kkv_model_load(ctypes.byref(p), self.path.encode(), int(n_threads)),
                  "Model")
        self._adopt(p.value)
        if exact_matmul:
            check(_M.kkv_model_set_exact_matmul(p.value, 1), "exact_matmul")
        info = _lib.ModelInfo()
        _M.kkv_model_get_info(p.value, ctypes.byref(info))
        self._info = info

    def _free(self, ptr):
        _M.kkv_model_free(ptr)

    @property
    def info(self):
        """The model's shape and special tokens (kkv_model_info) as a dict."""
        d = {}
        for f, _ in _lib.ModelInfo._fields_:
            v = getattr(self._info, f)
            d[f] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        return d

    @property
    def fingerprint(self):
        """A 64-bit fingerprint of the weights (kkv_model_fingerprint), which
        saved cache states record. Unsupported in builds without it."""
        if _lib.model_fingerprint is None:
            raise Unsupported("fingerprint: this build has no kkv_model_fingerprint")
        with self._use() as m:
            return int(_lib.model_fingerprint(m))

    @property
    def decode_bytes(self):
        """Bytes of weight matrices one decode step streams
        (kkv_model_decode_bytes): divided by a step's time, the bandwidth
        the weights demand. Unsupported in builds without it."""
        if _lib.model_decode_bytes is None:
            raise Unsupported("decode_bytes: this build has no kkv_model_decode_bytes")
        with self._use() as m:
            return int(_lib.model_decode_bytes(m))

    def profile(self, enable=True):
        """Starts (from zero) or stops timing the parts of this model's
        forward passes (kkv_model_profile); profile_times() reads the totals.
        Unsupported in builds without it."""
        if _lib.model_profile is None:
            raise Unsupported("profile: this build has no kkv_model_profile")
        with self._use() as m:
            check(_lib.model_profile(m, 1 if enable else 0), "profile")

    def profile_times(self):
        """(seconds per part, passes) since profiling last started: a dict
        from part name ("qkv", "attention", "out_proj", "ffn", "head",
        "other") to wall seconds summed over the passes timed."""
        if _lib.model_profile_get is None:
            raise Unsupported("profile_times: this build has no kkv_model_profile_get")
        sec = (ctypes.c_double * len(_lib.MODEL_PARTS))()
        passes = ctypes.c_int64(0)
        with self._use() as m:
            check(_lib.model_profile_get(m, sec, len(sec), ctypes.byref(passes)), "profile_times")
        return dict(zip(_lib.MODEL_PARTS, list(sec))), int(passes.value)

    n_vocab = property(lambda self: self._info.n_vocab)
    bos = property(lambda self: self._info.bos)
    eos = property(lambda self: self._info.eos)
    eot = property(lambda self: self._info.eot)

    # -- text
    def tokenize(self, text, add_bos=True, special=False):
        """Token ids of UTF-8 text as an int32 array. add_bos: prepend BOS when
        the model wants one; special: parse "<|im_start|>"-style text into
        special tokens."""
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        toks = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_int()
        with self._use() as m:
            check(_M.kkv_tokenize_alloc(m, ctypes.byref(toks), ctypes.byref(n), b, len(b),
                                        int(bool(add_bos)), int(bool(special))), "tokenize")
        try:
            return np.ctypeslib.as_array(toks, shape=(n.value,)).copy() if n.value else \
                np.zeros(0, np.int32)
        finally:
            _lib.libc.free(ctypes.cast(toks, ctypes.c_void_p))

    def token_piece(self, token):
        """The raw bytes of one token."""
        buf = ctypes.create_string_buffer(512)
        n = ctypes.c_size_t()
        with self._use() as m:
            check(_M.kkv_token_piece(m, buf, len(buf), ctypes.byref(n), int(token)),
                  "token_piece")
        return buf.raw[:n.value]

    def detokenize(self, tokens):
        """The text of token ids (invalid UTF-8 becomes U+FFFD)."""
        t = _i32(tokens, "detokenize")
        n = ctypes.c_size_t()
        with self._use() as m:
            s = _M.kkv_detokenize(m, None, 0, ctypes.byref(n), t.ctypes.data, len(t))
            if s != 0 and n.value == 0:
                check(s, "detokenize")
            buf = ctypes.create_string_buffer(max(n.value, 1))
            check(_M.kkv_detokenize(m, buf, len(buf), ctypes.byref(n), t.ctypes.data, len(t)),
                  "detokenize")
        return buf.raw[:n.value].decode("utf-8", "replace")

    @property
    def chat_template(self):
        """The family of the model's own chat template ("chatml", ...);
        NotFound without one, Unsupported for an unknown one."""
        name = ctypes.c_char_p()
        with self._use() as m:
            check(_M.kkv_chat_template_detect(m, ctypes.byref(name)), "chat_template")
        return name.value.decode()

    def chat_format(self, messages, add_generation_prompt=True, template=None):
        """Formats chat messages -- (role, content) pairs or {"role", "content"}
        dicts, roles "system", "user", "assistant" -- as a prompt with the
        model's chat template (or the named family), plus the assistant's
        opening when add_generation_prompt. Tokenize it with special=True."""
        msgs = []
        for msg in messages:
            role, content = (msg["role"], msg["content"]) if isinstance(msg, dict) else msg
            if "\0" in content:
                raise InvalidArgument("chat_format: a message cannot hold NUL characters")
            msgs.append(_lib.ChatMsg(role.encode(), content.encode("utf-8")))
        arr = (_lib.ChatMsg * max(len(msgs), 1))(*msgs)
        tmpl = template.encode() if template else None
        need = ctypes.c_size_t()
        with self._use() as m:
            s = _M.kkv_chat_format(m, None, 0, ctypes.byref(need), arr, len(msgs),
                                   int(bool(add_generation_prompt)), tmpl)
            if s != 0 and need.value == 0:
                check(s, "chat_format")
            buf = ctypes.create_string_buffer(need.value + 1)
            check(_M.kkv_chat_format(m, buf, len(buf), ctypes.byref(need), arr, len(msgs),
                                     int(bool(add_generation_prompt)), tmpl), "chat_format")
        return buf.raw[:need.value].decode("utf-8")

    # -- caches and forward passes
    def cache_config(self, method="kitty", pool_bytes=0, n_tokens=None):
        """kkv_cache_config for this model's shape (a ctypes struct, internal)."""
        meth = as_method(method)
        with self._use() as m:
            cfg = _M.kkv_model_cache_config(m, ctypes.byref(meth._m), int(pool_bytes))
        if n_tokens is not None:
            pb = ctypes.c_size_t()
            check(_E.kkv_eval_pool_bytes(ctypes.byref(pb), ctypes.byref(cfg), int(n_tokens)),
                  "pool size")
            cfg.pool_bytes = pb.value
        return cfg

    def cache(self, method="kitty", n_tokens=4096, *, pool_bytes=None, max_tokens=0,
              n_threads=0):
        """A Cache with this model's shape: sized for exactly n_tokens of one
        sequence, or with pool_bytes if given."""
        cfg = self.cache_config(method, pool_bytes or 0,
                                None if pool_bytes else n_tokens)
        cfg.max_tokens = int(max_tokens)
        cfg.n_threads = int(n_threads)
        return Cache._from_config(cfg)

    def forward(self, cache, seq, tokens, all_logits=False):
        """Runs token ids through the model, appending their K/V to every layer
        of `cache` for sequence seq. Returns the logits: [n_vocab] of the last
        token, or [n][n_vocab] with all_logits."""
        t = _i32(tokens, "forward")
        if len(t) == 0:
            raise InvalidArgument("forward: no tokens")
        V = self._info.n_vocab
        out = np.empty((len(t), V) if all_logits else (V,), np.float32)
        with self._use() as m, cache._use() as c:
            check(_M.kkv_model_forward(m, c, out.ctypes.data, int(seq), t.ctypes.data, len(t),
                                       int(bool(all_logits))), "forward")
        return out

    # -- generation
    def generate(self, prompt, max_tokens=128, kv="kitty", temperature=0.0, *, top_p=0.95,
                 top_k=0, min_p=0.0, repeat_penalty=1.0, repeat_last_n=64, seed=42,
                 chat=False, chat_template=None, ctx=8192, n_threads=0):
        """Generates a continuation of prompt with every attention read going
        through a `kv` cache (a Method or spec). Returns a Generation: iterate
        it for the text pieces as they complete (whole UTF-8 characters);
        afterwards .tokens holds the generated ids (the stop token included),
        .stopped whether the model ended its turn, .mem the cache's bytes.

        prompt: text (BOS added; chat formats it as one user message with the
        model's chat template, or the chat_template family) or a sequence of
        token ids used as they are. temperature 0 is greedy:
        the same ids as ``kittykv generate --temp 0 --ids-out``."""
        return Generation(self, prompt, max_tokens, kv, temperature, top_p, top_k, min_p,
                          repeat_penalty, repeat_last_n, seed, chat or bool(chat_template),
                          chat_template, ctx, n_threads)

    # -- evaluation
    def eval(self, text, methods=None, ctx=None, *, score_from=256, chunk=64, n_threads=0,
             keep_kld=False, progress=None):
        """Runs fp16 and every method in lock-step over the first ctx tokens of
        text (all of it when ctx is None; BOS added) and scores each against
        fp16 at every position after score_from: kkv_eval_run, the figures of
        ``kittykv eval --json``.

        methods: specs or Methods (default: every named method); "fp16"
        reports the reference itself. chunk only batches the matmuls (the
        figures are bit-identical for every chunk). keep_kld adds each
        method's per-position KL ("kld", float64 [scored]). progress:
        optional callable(done, total, seconds).

        Returns a dict: tokens, score_from, scored, chunk, fp16_ppl, model and
        methods, a list of {name, ppl, dppl_pct, kld_mean, kld_ci95, kld_p99,
        kld_max, top1, bits_per_element, kv_bytes, scored, seconds, mem};
        kld_ci95 is the half-width of the KLD mean's 95% interval
        (kkv_mean_ci95; nan with one scored position)."""
        if methods is None:
            specs = _method_names()
        elif isinstance(methods, (str, Method)):
            specs = [str(methods)] if isinstance(methods, Method) else methods.split(",")
        else:
            specs = [str(x) for x in methods]
        if not specs:
            raise InvalidArgument("eval: no methods")
        toks = self.tokenize(text, add_bos=True, special=False) if isinstance(text, str) \
            else _i32(text, "eval")
        if ctx is None:
            ctx = len(toks)
        if len(toks) < ctx:
            raise InvalidArgument(f"eval: the text has {len(toks)} tokens, fewer than ctx "
                                  f"{ctx}")
        toks = np.ascontiguousarray(toks[:ctx])
        cfg = _E.kkv_eval_defaults()
        cfg.n_tokens = int(ctx)
        cfg.score_from = int(score_from)
        cfg.chunk = int(chunk)
        cfg.n_threads = int(n_threads)
        cfg.keep_kld = 1  # the per-position KL gives kld_ci95; returned only if asked
        if progress is not None:
            cb = _lib.PROGRESS_FN(lambda user, done, total, secs: progress(done, total, secs))
            cfg.progress = cb
        n = len(specs)
        enc = [s.encode() for s in specs]
        arr = (ctypes.c_char_p * n)(*enc)
        res = (_lib.EvalResult * n)()
        ref = _lib.EvalResult()
        with self._use() as m:
            check(_E.kkv_eval_run(res, ctypes.byref(ref), m, toks.ctypes.data,
                                  ctypes.byref(cfg), arr, n), "eval")
        try:
            out = {"model": self._info.name.decode("utf-8", "replace") or self.path,
                   "tokens": int(ctx), "score_from": int(score_from), "scored": ref.scored,
                   "chunk": int(chunk), "fp16_ppl": ref.ppl, "methods": []}
            for i, spec in enumerate(specs):
                r = res[i]
                ci = _E.kkv_mean_ci95(r.kld, r.scored)
                d = {"name": spec, "ppl": r.ppl, "dppl_pct": r.dppl_pct,
                     "kld_mean": r.kld_mean, "kld_ci95": ci,
                     "kld_p99": r.kld_p99, "kld_max": r.kld_max,
                     "top1": r.top1, "bits_per_element": r.mem.bits_per_element,
                     "kv_bytes": int(r.mem.total), "scored": r.scored, "seconds": r.seconds,
                     "mem": _mem_dict(r.mem)}
                if keep_kld and r.kld:
                    d["kld"] = np.ctypeslib.as_array(r.kld, shape=(r.scored,)).copy()
                out["methods"].append(d)
            return out
        finally:
            _E.kkv_eval_results_free(res, n)
            _E.kkv_eval_results_free(ctypes.byref(ref), 1)

    def __repr__(self):
        return f"<kittykv.Model {self.path!r}{' closed' if self.closed else ''}>"


class Generation:
    """The iterator Model.generate() returns: text pieces as they complete.
    Owns a cache and a sampler, freed when the iteration ends or on close()."""

    def __init__(self, model, prompt, max_tokens, kv, temperature, top_p, top_k, min_p,
                 repeat_penalty, repeat_last_n, seed, chat, chat_template, ctx, n_threads):
        self.model = model
        self.method = as_method(kv)
        self.tokens = []      # generated ids, stop token included
        self.stopped = False  # True if the last id ends the text
        self.mem = None       # the cache's kkv_mem (dict) when done
        if isinstance(prompt, str):
            text = model.chat_format([("user", prompt)], True, chat_template) if chat \
                else prompt
            self.prompt_tokens = model.tokenize(text, add_bos=True, special=bool(chat))
        else:
            self.prompt_tokens = _i32(prompt, "generate")
        n_prompt = len(self.prompt_tokens)
        if n_prompt == 0:
            raise InvalidArgument("generate: the prompt is empty")
        self.max_tokens = int(max_tokens)
        if self.max_tokens < 0:
            raise InvalidArgument("generate: max_tokens must be >= 0")
        if n_prompt + self.max_tokens > ctx:
            raise InvalidArgument(f"generate: the prompt ({n_prompt} tokens) plus "
                                  f"{self.max_tokens} new tokens exceed the context of {ctx}")
        self.method.check(model._info.head_dim)
        sp = _M.kkv_sampler_defaults()
        sp.temp, sp.top_k, sp.top_p, sp.min_p = temperature, top_k, top_p, min_p
        sp.repeat_penalty, sp.repeat_last_n, sp.seed = repeat_penalty, repeat_last_n, seed
        self._sampler = _Sampler(sp)
        try:
            cfg = model.cache_config(self.method, 0, ctx)
            cfg.max_tokens = int(ctx)
            cfg.n_threads = int(n_threads)
            self._cache = Cache._from_config(cfg)
            self._seq = self._cache.add_sequence()
            self._cache.reserve(self._seq, n_prompt + self.max_tokens)
        except BaseException:
            self.close()
            raise
        self._it = self._run()

    def _run(self):
        m, cache, smp = self.model, self._cache, self._sampler
        info = m._info
        u8 = _lib.Utf8Stream()
        _M.kkv_utf8_stream_init(ctypes.byref(u8))
        out = ctypes.create_string_buffer(3 * (512 + 4))
        tok = ctypes.c_int32()
        try:
            with smp._use() as sp:
                for t in self.prompt_tokens:  # history for the repeat penalty
                    check(_M.kkv_sampler_accept(sp, int(t)), "generate")
            logits = m.forward(cache, self._seq, self.prompt_tokens)  # [n_vocab]
            while len(self.tokens) < self.max_tokens:
                with smp._use() as sp:
                    check(_M.kkv_sampler_sample(sp, ctypes.byref(tok), logits.ctypes.data,
                                                info.n_vocab), "generate")
                    check(_M.kkv_sampler_accept(sp, tok.value), "generate")
                t = tok.value
                self.tokens.append(t)
                if t == info.eos or t == info.eot:
                    self.stopped = True
                    break
                piece = m.token_piece(t)
                n = _M.kkv_utf8_stream_feed(ctypes.byref(u8), out, piece, len(piece))
                text = out.raw[:n].decode("utf-8")
                last = len(self.tokens) == self.max_tokens
                if not last:
                    logits = m.forward(cache, self._seq, [t])
                if text:
                    yield text
            n = _M.kkv_utf8_stream_flush(ctypes.byref(u8), out)
            self.mem = cache.mem(self._seq)
            if n:
                yield out.raw[:n].decode("utf-8")
        finally:
            self.close()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def text(self):
        """Runs to the end and returns the whole continuation."""
        return "".join(self)

    def close(self):
        """Stops the generation and frees its cache and sampler."""
        for h in (getattr(self, "_cache", None), getattr(self, "_sampler", None)):
            if h is not None:
                h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        it = getattr(self, "_it", None)
        if it is not None:
            it.close()
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
