"""ctypes view of the three shared libraries: where they are, the structs of the
public headers (include/kittykv*.h) field for field, and the signature of every
function the package calls. Nothing here is public API.

The libraries are found, in this order, in the folder named by the environment
variable KITTYKV_LIB_DIR (a CMake build folder, for working on the C side
without reinstalling) or in this package's folder, where `pip install .` puts
them. python/tests/test_layout.py compiles a C program that prints the sizes
and offsets of the real structs and compares them with the ones below, so a
header change that is not mirrored here fails a test instead of corrupting
memory.
"""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float,
                    c_int, c_int32, c_int64, c_long, c_size_t, c_ubyte, c_uint64, c_void_p)

_LIB_NAMES = ("libkittykv.so", "libkittykv-model.so", "libkittykv-eval.so")


def _lib_dirs():
    env = os.environ.get("KITTYKV_LIB_DIR")
    if env:
        return [env]
    return [os.path.dirname(os.path.abspath(__file__))]


def _load():
    """Loads core, model and eval, in dependency order, by full path: each
    later library's DT_NEEDED entries then resolve to the ones already loaded."""
    last_err = None
    for d in _lib_dirs():
        paths = [os.path.join(d, n) for n in _LIB_NAMES]
        if not all(os.path.exists(p) for p in paths):
            missing = [p for p in paths if not os.path.exists(p)]
            last_err = f"missing {', '.join(missing)}"
            continue
        try:
            return tuple(ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL) for p in paths)
        except OSError as e:  # e.g. libpcre2-8 not installed
            last_err = str(e)
    raise ImportError(
        "kittykv: cannot load the shared libraries (" + str(last_err) + "); install the "
        "package with `pip install .` from the repository, or point KITTYKV_LIB_DIR at a "
        "CMake build folder that holds " + ", ".join(_LIB_NAMES))


core, model, evl = _load()

# ------------------------------------------------------------------ structs
# Each mirrors the header's struct in order; the enums are C ints.


# Libraries with kkv_seq_fork came with two struct changes: kkv_method gained
# eager_values and kkv_mem shared/used. test_layout.py holds the structs below
# against the headers the package was built from.
HAS_FORK = hasattr(core, "kkv_seq_fork")


def _has_plus():
    # Libraries that name kitty-plus came with the options beyond the paper:
    # five kkv_method fields and kkv_cache_config rope_neox/rope_dims.
    f = core.kkv_method_names
    f.restype = POINTER(c_char_p)
    names, i = f(), 0
    while names[i] is not None:
        if names[i] == b"kitty-plus":
            return True
        i += 1
    return False


HAS_PLUS = _has_plus()
PLUS_FIELDS = ("pairs", "key_rot", "value_rot", "clip", "value_clip")
# Libraries with kkv_seq_key_page_boost came with three more kkv_method fields
# (the pooled budget and the int8 fidelity study of the fp16 parts).
HAS_BUDGET = hasattr(core, "kkv_seq_key_page_boost")
BUDGET_FIELDS = ("budget", "sink_int8", "window_int8")
# ... and those with kkv_key8_page_bytes with one more (8-bit key pages).
HAS_KEY8 = HAS_BUDGET and hasattr(core, "kkv_key8_page_bytes")
KEY8_FIELDS = ("key_bits",)


class Method(Structure):  # kkv_method
    _fields_ = [("fp16", c_int), ("sink", c_int), ("group", c_int), ("window", c_int),
                ("alpha", c_float), ("value_bits", c_int), ("select", c_int),
                ("seed", c_uint64)] + ([("eager_values", c_int)] if HAS_FORK else []) + \
        ([(f, c_int) for f in PLUS_FIELDS] if HAS_PLUS else []) + \
        ([(f, c_int) for f in BUDGET_FIELDS] if HAS_BUDGET else []) + \
        ([(f, c_int) for f in KEY8_FIELDS] if HAS_KEY8 else [])


class CacheConfig(Structure):  # kkv_cache_config
    _fields_ = [("n_layers", c_int), ("n_kv_heads", c_int), ("head_dim", c_int),
                ("pool_bytes", c_size_t), ("max_seqs", c_int), ("max_tokens", c_int),
                ("n_threads", c_int), ("method", Method)] + \
        ([("rope_neox", c_int), ("rope_dims", c_int)] if HAS_PLUS else []) + \
        [("layer_window", POINTER(c_int))]  # NULL here: no windowed layers


class SeqInfo(Structure):  # kkv_seq_info
    _fields_ = [("len", c_int), ("sink", c_int), ("key_pages", c_int),
                ("value_pages", c_int), ("key_buffer", c_int), ("value_tail", c_int)]


MEM_FIELDS = ["key_lo", "key_hi", "key_idx", "key_meta", "value_codes", "value_meta",
              "fp16", "total", "capacity", "tokens"]


MEM_EXTRA = ["shared", "used"] if HAS_FORK else []  # uint64s after bits_per_element
MEM_EXTRA += ["sink_int8"] if HAS_KEY8 else []  # int8 sink rows, part of total


class Mem(Structure):  # kkv_mem
    _fields_ = ([(f, c_uint64) for f in MEM_FIELDS] + [("bits_per_element", c_double)] +
                [(f, c_uint64) for f in MEM_EXTRA])


class ModelInfo(Structure):  # kkv_model_info
    _fields_ = [("arch", c_char * 32), ("name", c_char * 128), ("n_layers", c_int),
                ("n_embd", c_int), ("n_heads", c_int), ("n_kv_heads", c_int),
                ("head_dim", c_int), ("n_ff", c_int), ("n_vocab", c_int),
                ("n_ctx_train", c_int), ("rope_theta", c_float), ("rms_eps", c_float),
                ("bos", c_int), ("eos", c_int), ("eot", c_int), ("weight_bytes", c_uint64),
                ("rope_neox", c_int), ("rope_dims", c_int),
                ("sliding_window", c_int), ("rope_theta_swa", c_float)]


class ChatMsg(Structure):  # kkv_chat_msg
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class SamplerParams(Structure):  # kkv_sampler_params
    _fields_ = [("temp", c_float), ("top_k", c_int), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int), ("seed", c_uint64)]


class Utf8Stream(Structure):  # kkv_utf8_stream
    _fields_ = [("pend", c_ubyte * 4), ("n_pend", c_int), ("need", c_int)]


PROGRESS_FN = CFUNCTYPE(None, c_void_p, c_long, c_long, c_double)  # kkv_eval_progress_fn


class EvalConfig(Structure):  # kkv_eval_config
    _fields_ = [("n_tokens", c_int), ("score_from", c_int), ("chunk", c_int),
                ("n_threads", c_int), ("pool", c_void_p), ("keep_kld", c_int),
                ("ranks", POINTER(c_ubyte)),
                ("progress", PROGRESS_FN), ("progress_user", c_void_p)]


class EvalResult(Structure):  # kkv_eval_result
    _fields_ = [("spec", c_char * 128), ("method", Method), ("scored", c_long),
                ("nll_sum", c_double), ("ppl", c_double), ("dppl_pct", c_double),
                ("kld_mean", c_double), ("kld_p99", c_double), ("kld_max", c_double),
                ("top1", c_double), ("seconds", c_double), ("mem", Mem),
                ("kld", POINTER(c_double))]


# The structs test_layout.py checks against the C compiler's view.
STRUCTS = {"kkv_method": Method, "kkv_cache_config": CacheConfig, "kkv_seq_info": SeqInfo,
           "kkv_mem": Mem, "kkv_model_info": ModelInfo,
           "kkv_sampler_params": SamplerParams, "kkv_chat_msg": ChatMsg, "kkv_utf8_stream": Utf8Stream,
           "kkv_eval_config": EvalConfig, "kkv_eval_result": EvalResult}

# ------------------------------------------------------------------ functions

# Buffers are passed as addresses (numpy's arr.ctypes.data, plus an offset for
# one row): the C side reads the array's own memory, nothing is copied.
F32P = c_void_p
I32P = c_void_p
st = c_int  # kkv_status


def _decl(lib, name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


def _opt(lib, name, res, *args):
    """A function that only some versions of the library have (None if absent)."""
    try:
        return _decl(lib, name, res, *args)
    except AttributeError:
        return None


# status, methods
_decl(core, "kkv_status_str", c_char_p, c_int)
_decl(core, "kkv_last_error", c_char_p)
_decl(core, "kkv_method_from_name", st, POINTER(Method), c_char_p)
_decl(core, "kkv_method_names", POINTER(c_char_p))
_decl(core, "kkv_method_parse", st, POINTER(Method), c_char_p)
_decl(core, "kkv_method_format", st, c_char_p, c_size_t, POINTER(c_size_t), POINTER(Method))
_decl(core, "kkv_method_check", st, POINTER(Method), c_int)
_decl(core, "kkv_method_boost", c_int, POINTER(Method), c_int)
_decl(core, "kkv_key_page_bytes", c_size_t, c_int, c_int, c_int)
_decl(core, "kkv_value_page_bytes", c_size_t, c_int, c_int, c_int)
# cache
_decl(core, "kkv_cache_create", st, POINTER(c_void_p), POINTER(CacheConfig))
_decl(core, "kkv_cache_free", None, c_void_p)
_decl(core, "kkv_cache_get_config", POINTER(CacheConfig), c_void_p)
_decl(core, "kkv_seq_add", st, c_void_p, POINTER(c_int))
_decl(core, "kkv_seq_free", st, c_void_p, c_int)
_decl(core, "kkv_seq_len", c_int, c_void_p, c_int, c_int)
_decl(core, "kkv_seq_reserve", st, c_void_p, c_int, c_int)
_decl(core, "kkv_append", st, c_void_p, c_int, c_int, F32P, F32P)
_decl(core, "kkv_flush", st, c_void_p, c_int, c_int)
_decl(core, "kkv_attend", st, c_void_p, F32P, c_int, c_int, F32P, c_int)
attend_batch = _opt(core, "kkv_attend_batch", st, c_void_p, F32P, I32P, c_int, c_int, F32P, c_int)
_decl(core, "kkv_cache_set_rank", st, c_void_p, c_int, c_int, POINTER(c_ubyte))
_decl(core, "kkv_seq_read", st, c_void_p, F32P, F32P, c_int, c_int, c_int)
_decl(core, "kkv_seq_get_info", st, c_void_p, POINTER(SeqInfo), c_int, c_int)
_decl(core, "kkv_seq_key_page", st, c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_int)
if HAS_BUDGET:
    _decl(core, "kkv_seq_key_page_boost", c_int, c_void_p, c_int, c_int, c_int, c_int)
if HAS_KEY8:
    _decl(core, "kkv_method_key_page_bytes", c_size_t, POINTER(Method), c_int, c_int)
_decl(core, "kkv_seq_mem", st, c_void_p, POINTER(Mem), c_int)
_decl(core, "kkv_cache_mem", st, c_void_p, POINTER(Mem))
_decl(core, "kkv_cache_free_bytes", c_uint64, c_void_p)
_decl(core, "kkv_kernel_best", c_int)
_decl(core, "kkv_kernel_name", c_char_p, c_int)
_decl(core, "kkv_cache_get_kernel", c_int, c_void_p)
_decl(core, "kkv_cache_set_kernel", st, c_void_p, c_int)
_decl(core, "kkv_cpu_count", c_int)
_decl(core, "kkv_cpu_name", c_char_p)
# optional: forks of a sequence, saved states (not in every version)


class StateMeta(Structure):  # kkv_state_meta
    _fields_ = [("model_fingerprint", c_uint64), ("tokens", c_void_p), ("n_tokens", c_int)]


seq_fork = _opt(core, "kkv_seq_fork", st, c_void_p, POINTER(c_int), c_int)
seq_save = _opt(core, "kkv_seq_save", st, c_void_p, c_void_p, c_size_t, POINTER(c_size_t),
                c_int, POINTER(StateMeta))
seq_save_file = _opt(core, "kkv_seq_save_file", st, c_void_p, c_char_p, c_int,
                     POINTER(StateMeta))
seq_load = _opt(core, "kkv_seq_load", st, c_void_p, POINTER(c_int), c_void_p, c_size_t,
                c_uint64, I32P, c_int, POINTER(c_int))
seq_load_file = _opt(core, "kkv_seq_load_file", st, c_void_p, POINTER(c_int), c_char_p,
                     c_uint64, I32P, c_int, POINTER(c_int))
if seq_save is not None:
    STRUCTS["kkv_state_meta"] = StateMeta

# model
_decl(model, "kkv_model_load", st, POINTER(c_void_p), c_char_p, c_int)
_decl(model, "kkv_model_load_vocab", st, POINTER(c_void_p), c_char_p, c_char_p)
_decl(model, "kkv_model_free", None, c_void_p)
_decl(model, "kkv_model_get_info", None, c_void_p, POINTER(ModelInfo))
_decl(model, "kkv_model_set_exact_matmul", st, c_void_p, c_int)
model_fingerprint = _opt(model, "kkv_model_fingerprint", c_uint64, c_void_p)
model_decode_bytes = _opt(model, "kkv_model_decode_bytes", c_uint64, c_void_p)
model_profile = _opt(model, "kkv_model_profile", st, c_void_p, c_int)
model_profile_get = _opt(model, "kkv_model_profile_get", st, c_void_p, POINTER(c_double), c_int,
                         POINTER(c_int64))
model_part_name = _opt(model, "kkv_model_part_name", c_char_p, c_int)
MODEL_PART_COUNT = 6  # KKV_PART_COUNT of the header this binding mirrors
MODEL_PARTS = (tuple(model_part_name(i).decode() for i in range(MODEL_PART_COUNT))
               if model_part_name is not None else ())  # names from the library, in part order
_decl(model, "kkv_model_cache_config", CacheConfig, c_void_p, POINTER(Method), c_size_t)
_decl(model, "kkv_model_forward", st, c_void_p, c_void_p, F32P, c_int, I32P, c_int, c_int)
_decl(model, "kkv_tokenize_alloc", st, c_void_p, POINTER(POINTER(c_int32)), POINTER(c_int), c_char_p,
      c_size_t, c_int, c_int)
_decl(model, "kkv_token_piece", st, c_void_p, c_char_p, c_size_t, POINTER(c_size_t), c_int32)
_decl(model, "kkv_detokenize", st, c_void_p, c_char_p, c_size_t, POINTER(c_size_t), I32P,
      c_int)
_decl(model, "kkv_chat_template_names", POINTER(c_char_p))
_decl(model, "kkv_chat_template_detect", st, c_void_p, POINTER(c_char_p))
_decl(model, "kkv_chat_format", st, c_void_p, c_char_p, c_size_t, POINTER(c_size_t),
      POINTER(ChatMsg), c_int, c_int, c_char_p)
_decl(model, "kkv_utf8_stream_init", None, POINTER(Utf8Stream))
_decl(model, "kkv_utf8_stream_feed", c_size_t, POINTER(Utf8Stream), c_char_p, c_char_p,
      c_size_t)
_decl(model, "kkv_utf8_stream_flush", c_size_t, POINTER(Utf8Stream), c_char_p)
_decl(model, "kkv_sampler_defaults", SamplerParams)
_decl(model, "kkv_sampler_create", st, POINTER(c_void_p), POINTER(SamplerParams))
_decl(model, "kkv_sampler_free", None, c_void_p)
_decl(model, "kkv_sampler_sample", st, c_void_p, POINTER(c_int32), F32P, c_int)
_decl(model, "kkv_sampler_accept", st, c_void_p, c_int32)

# eval
_decl(evl, "kkv_eval_defaults", EvalConfig)
_decl(evl, "kkv_eval_run", st, POINTER(EvalResult), POINTER(EvalResult), c_void_p, I32P,
      POINTER(EvalConfig), POINTER(c_char_p), c_int)
_decl(evl, "kkv_eval_results_free", None, POINTER(EvalResult), c_int)
_decl(evl, "kkv_mean_ci95", c_double, POINTER(c_double), c_long)
_decl(evl, "kkv_eval_pool_bytes", st, POINTER(c_size_t), POINTER(CacheConfig), c_int)

# the C library's free(), for the arrays kkv_tokenize_alloc hands over
libc = ctypes.CDLL(None)
libc.free.restype = None
libc.free.argtypes = [c_void_p]
