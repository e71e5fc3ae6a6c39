"""Handles are freed: RSS stays flat over many create/free cycles, the count of
live native handles returns to zero, a generation stopped early frees its
cache and sampler, and a closed model raises instead of crashing."""
import gc
import os

import numpy as np
import pytest

import kittykv


def _rss():
    """Resident set size in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cycle(n):
    k = np.ones(64, np.float32)
    for i in range(n):
        c = kittykv.Cache(2, 2, 32, "kitty", 1 << 20)
        s = c.add_sequence()
        c.append(s, 0, np.ones((2, 32)), np.ones((2, 32)))
        c.attend(s, 0, np.ones((4, 32)))
        if i % 2:
            c.close()  # explicit close for half, garbage collection for the rest
        del c
    # quantize creates and frees its own cache
    for _ in range(n // 10):
        kittykv.quantize(np.tile(k, (40, 1)), method="kitty:group=8:sink=2:window=4")


def test_rss_flat_over_1000_cache_create_free():
    base = kittykv.live_handles()
    _cycle(200)  # warm up the allocator
    gc.collect()
    before = _rss()
    _cycle(1000)
    gc.collect()
    grown = _rss() - before
    assert kittykv.live_handles() == base
    assert grown < 4 << 20, f"RSS grew by {grown} bytes over 1000 create/free"


def test_model_handles_are_freed(model_path):
    base = kittykv.live_handles()
    for _ in range(3):
        with kittykv.Model(model_path, n_threads=1, vocab_only=True) as m:
            assert len(m.tokenize("hello world")) >= 2
    gc.collect()
    before = _rss()
    for _ in range(30):
        m = kittykv.Model(model_path, n_threads=1, vocab_only=True)
        m.tokenize("hello world")
        del m
    gc.collect()
    assert kittykv.live_handles() == base
    assert _rss() - before < 8 << 20


def test_generation_stopped_early_frees_its_handles(model):
    base = kittykv.live_handles()
    g = model.generate("Once upon a time", 50, kv="kitty")
    assert kittykv.live_handles() == base + 2  # its cache and sampler
    next(g)
    g.close()
    assert kittykv.live_handles() == base
    with model.generate("Once upon a time", 3, kv="fp16") as g2:
        list(g2)
    assert kittykv.live_handles() == base
    g3 = model.generate("Once upon a time", 50, kv="fp16")
    next(g3)
    del g3
    gc.collect()
    assert kittykv.live_handles() == base


def test_closed_model_raises(model_path):
    m = kittykv.Model(model_path, n_threads=1)
    g = m.generate("Once upon a time", 20, kv="kitty")
    next(g)
    c = m.cache("kitty", 64)
    m.close()
    for call in (lambda: m.tokenize("x"), lambda: m.detokenize([1, 2]),
                 lambda: m.eval("some text here", ["kitty"], 4, score_from=1),
                 lambda: m.generate("x", 2), lambda: m.forward(c, 0, [1]),
                 lambda: next(g)):
        with pytest.raises(kittykv.ClosedError):
            call()
    c.close()
