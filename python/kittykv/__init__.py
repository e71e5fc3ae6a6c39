"""kittykv: a 2-bit paged KV cache with channel-wise precision boost (Kitty) and
the KIVI baselines, fused attention over the quantized pages, a GGUF engine and
lock-step evaluation -- the C library, from Python, numpy in and out.

    import numpy as np, kittykv
    kittykv.methods()                         # ['fp16', 'kivi-k2v2', ..., 'kitty-pro']
    m = kittykv.Method.parse("kitty:alpha=0.25:select=variance")
    q = kittykv.quantize(np.random.randn(512, 64), method=m)
    q.keys, q.bytes, q.bits_per_element       # what attention sees, bytes by part
    with kittykv.Cache(1, 1, 64, "kitty", 8 << 20) as c:
        s = c.add_sequence()                  # append / attend / flush per token
    with kittykv.Model("SmolLM2-135M-Instruct.Q4_1.gguf") as lm:
        print("".join(lm.generate("The capital of France is", 16, kv="kitty")))

Library failures raise kittykv.Error subclasses (one per kkv_status) carrying
the library's one-line message; a closed handle raises kittykv.ClosedError.
Buffers the C side reads are passed in place (float32, C-contiguous arrays are
not copied).
"""
from . import _lib
from ._errors import (ClosedError, ContextFull, Error, FileError, FormatError, InvalidArgument,
                      NonFinite, NotFound, OutOfMemory, PoolFull, Unsupported, status_str)
from ._handle import live_handles
from .core import KERNEL_NAMES, SELECT_NAMES, Cache, Method, Quantized, methods, quantize
from .model import Generation, Model, chat_templates

__version__ = "0.1.0"


def kernel_best():
    """The best attention kernel this CPU and build support ("avx2", ...)."""
    return _lib.core.kkv_kernel_name(_lib.core.kkv_kernel_best()).decode()


def cpu_count():
    """Online cores, as the library counts them."""
    return _lib.core.kkv_cpu_count()


def cpu_name():
    """One line naming this CPU for reports: brand, family, model and the
    instruction sets the kernels may use, e.g.
    "AMD EPYC (family 23, model 1; kernels: avx2)"."""
    return _lib.core.kkv_cpu_name().decode()


__all__ = ["Cache", "ClosedError", "ContextFull", "Error", "FileError", "FormatError",
           "Generation", "InvalidArgument", "KERNEL_NAMES", "Method", "Model", "NonFinite",
           "NotFound", "OutOfMemory", "PoolFull", "Quantized", "SELECT_NAMES", "Unsupported",
           "chat_templates", "cpu_count", "cpu_name", "kernel_best", "live_handles", "methods", "quantize",
           "status_str"]
