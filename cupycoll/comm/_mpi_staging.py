"""How the MPI backend's buffers reach MPI: a reduction's buffers widened (half precision),
staged on the host (device arrays) or de-aliased, avg's division and the copy back after the
transfer, and the pool of staging arrays finished calls leave for the next."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .._config import check_run_settings
from .._types import ReduceOp, to_host
from ..primitives._numpy_reduce import canonical_nan
from ._mpi_types import (_NATIVE, _address, _give, _mpi_op, _native, _separate, _take, _typed,
                         _widened, averaged, copied_into)

__all__ = ["Staging", "settings_first"]

_AVG = ReduceOp.AVG  # a module constant: no Enum member lookup per call
#: the float reductions whose MPI op or finish reads CUPYCOLL_NUMBA (max/min fold, avg divides)
_PARSE_FIRST = frozenset((ReduceOp.MAX, ReduceOp.MIN, _AVG))
_MINMAX = frozenset((ReduceOp.MAX, ReduceOp.MIN))


def settings_first(rank: int, op: ReduceOp, dtype: Any) -> None:
    """Raise a bad ``CUPYCOLL_NUMBA`` (read by the float max/min/avg folds) before anything is
    posted: every rank that has it raises at once, not in MPI's callback (a fatal error), nor
    mid-exchange on the one rank whose block reaches numba's size, nor on the root alone."""
    if op in _PARSE_FIRST and np.dtype(dtype).kind == "f":
        check_run_settings(rank)


class Staging:
    """The staging methods of :class:`cupycoll.comm.mpi.MPICommunicator` (``size``, ``xp``
    and the pool ``_spare`` are the communicator's)."""

    size: int
    xp: Any
    _spare: list[np.ndarray]

    def _reduction(self, send: Any, recv: Any, op: ReduceOp, in_place_ok: bool) -> tuple:
        """(send spec, recv spec, MPI op), finalize, buffers to keep alive of one reduction of
        ``send`` into ``recv`` (None: a non-root rank of reduce).

        The common case costs a few lookups: host arrays of one dtype MPI reduces natively,
        ``send`` C-contiguous, ``recv`` the same array (in place) or apart from it. Anything
        else is widened, staged or de-aliased by :meth:`_reduction_buffers`.
        """
        settings_first(self.rank, op, send.dtype)
        if (type(send) is np.ndarray and send.flags.c_contiguous
                and (recv is None or type(recv) is np.ndarray and recv.dtype is send.dtype)):
            spec = _NATIVE[op].get(send.dtype) or _native(op, send.dtype)
            if spec is not None and (recv is None or send is not recv or in_place_ok):
                mpi_type, mpi_op = spec
                finalize = self._finish_reduction(recv, recv, op) \
                    if op is _AVG or self.size == 1 else None
                if recv is None:
                    return ([send, mpi_type], None, mpi_op), None, (send,)
                if send is recv:
                    return (MPI.IN_PLACE, [recv, mpi_type], mpi_op), finalize, (recv,)
                if _separate(send, recv):
                    return ([send, mpi_type], [recv, mpi_type], mpi_op), finalize, (send, recv)
        host_send, host_recv, in_place = self._reduction_buffers(send, recv, in_place_ok)
        args = (MPI.IN_PLACE if in_place else _typed(host_send),
                None if host_recv is None else _typed(host_recv), _mpi_op(op, host_send.dtype))
        finalize = self._finish_reduction(host_recv, recv, op)
        if _widened(np.dtype(send.dtype)) is not None:  # the widened input: pooled too
            finalize = self._then_release(finalize, host_send)
        return args, finalize, (host_send, host_recv)

    def _reduction_buffers(self, send: Any, recv: Any, in_place_ok: bool):
        """Host buffers MPI can reduce (widened, staged, de-aliased) and whether in place."""
        dtype = np.dtype(send.dtype)
        wide = _widened(dtype)
        host_send = to_host(send)
        if wide is not None:  # widened into a pooled buffer (released by the finalize)
            widened = self._scratch(host_send.shape, np.dtype(wide))
            np.copyto(widened, host_send)
            host_send = widened
        direct = wide is None and isinstance(recv, np.ndarray)
        if recv is None:
            host_recv = None
        elif direct:
            host_recv = recv
        else:
            host_recv = self._scratch(recv.shape, host_send.dtype)
        same = direct and host_send.flags.c_contiguous and host_send.nbytes == host_recv.nbytes \
            and _address(host_send) == _address(host_recv)
        in_place = in_place_ok and same  # NCCL's rule: in place when the pointers are equal
        if direct and not in_place and np.shares_memory(host_send, host_recv):
            # MPI forbids aliased buffers: stage the smaller side (reduce_scatter's block, a
            # P-th of the input, is received apart and copied back by the finalize)
            if host_recv.nbytes < host_send.nbytes:
                host_recv = self._scratch(recv.shape, host_send.dtype)
            else:
                host_send = host_send.copy()
        return np.ascontiguousarray(host_send), host_recv, in_place

    def _finish_reduction(self, host_recv: Any, recv: Any, op: ReduceOp):
        """What must run after the transfer: avg's division, copying back a staged result,
        a lone rank's float max/min NaNs made numpy's (MPI calls no user op for one rank: the
        NaN came in as it was) (None when nothing must)."""
        alone = self.size == 1 and op in _MINMAX and host_recv is not None \
            and host_recv.dtype.kind == "f"
        if host_recv is None or (host_recv is recv and op is not _AVG and not alone):
            return None

        def finalize() -> None:
            if op is _AVG:
                averaged(host_recv, self.size)
            elif host_recv.dtype.kind == "f":  # staged: a pass here anyway
                canonical_nan(host_recv)
            if host_recv is not recv:
                with np.errstate(all="ignore"):  # float16 beyond 65504 is inf, never a raise
                    if isinstance(recv, np.ndarray):  # cast in the copy: no temporary
                        np.copyto(recv, host_recv, casting="unsafe")
                    else:
                        copied_into(recv, host_recv.astype(recv.dtype, copy=False), self.xp)
                self._release(host_recv)
        return finalize

    def _scratch(self, shape: tuple, dtype: Any) -> np.ndarray:
        """A staging array from this communicator's pool (:func:`._mpi_types._take`)."""
        return _take(self._spare, shape, dtype)

    def send_buffer(self, nbytes: int) -> Any:
        """A host block to send: from this communicator's staging pool (its pages mapped: a
        fresh one costs a page fault per 4 KiB, in a job whose other allocations keep
        the allocator from reusing freed memory); device arrays: a new one."""
        if self.xp is not np:
            return self.xp.empty(nbytes, dtype=np.uint8)
        return self._scratch((nbytes,), np.dtype(np.uint8))

    def release_send_buffer(self, buffer: Any) -> None:
        if self.xp is np:
            self._release(buffer)

    def _release(self, array: np.ndarray) -> None:
        """Give a finished call's staging array back to the pool."""
        _give(self._spare, array)

    def _then_release(self, finalize: Any, scratch: np.ndarray):
        """``finalize`` (if any), then give ``scratch`` back to the pool."""
        def both() -> None:
            if finalize is not None:
                finalize()
            self._release(scratch)
        return both

    def _staged(self, recv: Any) -> tuple[np.ndarray, Any]:
        """A contiguous host array to receive ``recv``'s bytes into, and what copies them into
        ``recv`` afterwards (None: ``recv`` itself)."""
        if type(recv) is np.ndarray and recv.flags.c_contiguous:
            return recv, None
        host = np.empty(recv.shape, recv.dtype)
        return host, lambda: copied_into(recv, host, self.xp)

