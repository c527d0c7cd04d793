"""Non-blocking NCCL communicators through CuPy's binding.

NCCL guarantees that ``ncclCommAbort`` may be called at any point only for non-blocking
communicators (``ncclConfig_t.blocking = 0``): their calls return ``ncclInProgress`` instead of
blocking the host while NCCL connects to peers, and ``ncclCommGetAsyncError`` tells when the
call has been issued. CuPy's ``NcclConfig`` wraps an ``ncclConfig_t`` but exposes only
``split_share``; :func:`nonblocking_config` sets ``blocking`` in the structure CuPy holds. The
field is found by the structure's own layout (``size_t size; unsigned magic; unsigned version;
int blocking``, the same in every NCCL since 2.14, ``magic`` = ``NCCL_API_MAGIC``), never by a
guessed object offset, and only when the structure reads back as NCCL's initializer wrote it;
otherwise the communicator stays blocking (see docs/gpu.md, "Abort and close").
"""

from __future__ import annotations

import ctypes
import struct
import sys
from typing import Any

__all__ = ["nonblocking_config", "blocking_of", "IN_PROGRESS", "in_progress",
           "NonBlockingCommunicator"]

#: ``ncclInProgress``: a non-blocking call (or the communicator's init) is still being issued.
IN_PROGRESS = 7


def in_progress(exc: BaseException) -> bool:
    """Whether an exception from a CuPy NCCL call means ``ncclInProgress``.

    CuPy's ``check_status`` raises ``NcclError(status)``, whose constructor looks the status up
    in a table that stops at ncclRemoteError (6): for ncclInProgress it raises ``KeyError(7)``
    instead. Both spellings are recognised (a CuPy that names the status raises NcclError).
    """
    if isinstance(exc, KeyError):
        return exc.args == (IN_PROGRESS,)
    return getattr(exc, "status", None) == IN_PROGRESS
_MAGIC = struct.pack("<I", 0xCAFEBEEF)  # NCCL_API_MAGIC
_UNDEF_INT = -(2**31)  # NCCL_CONFIG_UNDEF_INT: blocking as NCCL_CONFIG_INITIALIZER leaves it
_FIRST_CONFIG_VERSION = 21400  # ncclConfig_t with ``blocking`` (NCCL 2.14)


def _blocking_address(config: Any) -> int | None:
    """Address of ``blocking`` inside the ``ncclConfig_t`` of a CuPy ``NcclConfig``, or None
    when the object does not hold exactly one structure that reads back as initialised."""
    base, size = id(config), sys.getsizeof(config)
    raw = ctypes.string_at(base, size)
    at = raw.find(_MAGIC)
    if at < 8 or raw.find(_MAGIC, at + 1) != -1 or at + 12 > size:
        return None
    struct_size = struct.unpack_from("<Q", raw, at - 8)[0]
    version = struct.unpack_from("<I", raw, at + 4)[0]
    if not 24 <= struct_size <= size - (at - 8) or version < _FIRST_CONFIG_VERSION:
        return None
    return base + at + 8


def blocking_of(config: Any) -> int | None:
    """The ``blocking`` field of a CuPy ``NcclConfig`` (None: not an NCCL config structure)."""
    address = _blocking_address(config)
    return None if address is None else ctypes.c_int.from_address(address).value


def nonblocking_config(nccl: Any) -> Any | None:
    """A CuPy ``NcclConfig`` with ``blocking = 0``, or None where this CuPy cannot make one."""
    make = getattr(nccl, "NcclConfig", None)
    if make is None:
        return None
    try:
        config = make()
    except Exception:  # CuPy built against an NCCL without ncclConfig_t
        return None
    address = _blocking_address(config)
    if address is None or ctypes.c_int.from_address(address).value != _UNDEF_INT:
        return None
    ctypes.c_int.from_address(address).value = 0
    return config


def NonBlockingCommunicator(nccl: Any) -> type:
    """CuPy's ``NcclCommunicator`` class, subclassed so that a non-blocking init that returns
    ``ncclInProgress`` keeps its communicator (CuPy raises after storing it, see
    :func:`in_progress`)."""
    base = nccl.NcclCommunicator
    found = _SUBCLASSES.get(base)
    if found is None:
        class _NonBlocking(base):  # type: ignore[misc, valid-type]
            def __init__(self, ndev: int, uid: Any, rank: int, config: Any) -> None:
                try:
                    super().__init__(ndev, uid, rank, config)
                except (nccl.NcclError, KeyError) as exc:
                    if not in_progress(exc):
                        raise
        found = _SUBCLASSES[base] = _NonBlocking
    return found


_SUBCLASSES: dict[type, type] = {}
