"""Owned native handles: freed exactly once (close(), a with-block, or garbage
collection), and unusable after that without touching freed memory."""
import contextlib
import threading

from ._errors import ClosedError

_live_lock = threading.Lock()
_live = 0  # native handles created and not yet freed, all kinds together


def live_handles():
    """Native handles (caches, models, samplers) currently alive; for leak tests."""
    return _live


class Handle:
    """Base of Cache, Model and the internal sampler. Every call into the
    library holds the handle's lock, so a handle is never used by two threads
    at once (the library forbids it) and close() cannot free it under a
    running call."""

    _kind = "handle"

    def __init__(self):
        self._ptr = None
        self._lock = threading.RLock()

    def _adopt(self, ptr):
        global _live
        self._ptr = ptr
        with _live_lock:
            _live += 1

    @contextlib.contextmanager
    def _use(self):
        with self._lock:
            if self._ptr is None:
                raise ClosedError(f"this {self._kind} is closed")
            yield self._ptr

    @property
    def closed(self):
        """True once the handle has been freed."""
        return self._ptr is None

    def close(self):
        """Frees the native object now. Safe to call twice; later calls on the
        object raise kittykv.ClosedError."""
        global _live
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ did not get that far
            return
        with lock:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                self._free(ptr)
                with _live_lock:
                    _live -= 1

    def _free(self, ptr):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass
