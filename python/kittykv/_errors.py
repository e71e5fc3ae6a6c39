"""Exceptions: one kittykv.Error subclass per kkv_status, carrying the library's
one-line message (kkv_last_error()), plus ClosedError for a freed handle."""
from . import _lib


class Error(Exception):
    """A failure reported by the kittykv library.

    Attributes: ``status`` (the kkv_status number, None for errors raised by the
    bindings themselves) and ``message`` (the library's one-line message)."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgument(Error, ValueError):
    """KKV_ERR_INVALID_ARG: a parameter is out of range or inconsistent."""
    status = 1


class OutOfMemory(Error, MemoryError):
    """KKV_ERR_NOMEM: an allocation failed."""
    status = 2


class PoolFull(Error):
    """KKV_ERR_POOL_FULL: the cache's page pool cannot take another page; the
    cache is as it was before the call."""
    status = 3


class FileError(Error, OSError):
    """KKV_ERR_IO: a file could not be opened, read or mapped."""
    status = 4


class FormatError(Error):
    """KKV_ERR_FORMAT: a file is malformed or truncated."""
    status = 5


class Unsupported(Error):
    """KKV_ERR_UNSUPPORTED: valid input this build does not handle."""
    status = 6


class NonFinite(Error, ValueError):
    """KKV_ERR_NONFINITE: NaN or Inf in keys, values or queries (nothing stored)."""
    status = 7


class NotFound(Error, LookupError):
    """KKV_ERR_NOT_FOUND: no such sequence, method, tensor or file."""
    status = 8


class ContextFull(Error):
    """KKV_ERR_CTX_FULL: the sequence would exceed its context limit."""
    status = 9


class ClosedError(Error, ValueError):
    """The handle was closed (freed); using it again raises this instead of
    touching freed memory."""


_BY_STATUS = {c.status: c for c in (InvalidArgument, OutOfMemory, PoolFull, FileError,
                                    FormatError, Unsupported, NonFinite, NotFound,
                                    ContextFull)}


def status_str(status):
    """The library's English name of a kkv_status number ("pool full", ...)."""
    return _lib.core.kkv_status_str(int(status)).decode()


def raise_for(status, what=None):
    """Raises the Error subclass of a non-zero kkv_status, with kkv_last_error().
    Must run on the thread that made the failing call (the message is
    thread-local), right after it."""
    if status == 0:
        return
    msg = _lib.core.kkv_last_error().decode("utf-8", "replace") or status_str(status)
    if what:
        msg = f"{what}: {msg}"
    raise _BY_STATUS.get(status, Error)(msg, status)


def check(status, what=None):
    if status != 0:
        raise_for(status, what)
