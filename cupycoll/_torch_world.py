"""The MPI communicator under a ``cupycoll`` process group, and the ``cupycoll://`` rendezvous.

Under ``mpiexec`` the group's processes are MPI's ``COMM_WORLD``, ordered by torch's rank.
Processes started apart (``torchrun``) are joined with MPI's port functions: torch's rank 0
opens a port, hands its name to each other rank in turn through the group's c10d store, and
accepts it (``Comm.Accept`` / ``Comm.Connect``, then ``Intercomm.Merge``), so the merged
communicator holds the ranks in torch's order; the port is closed once every rank has joined.
That needs every process to be an MPI world of its own that MPI can tell apart from the
others: with the mpich wheel, a process started under ``mpiexec -n 1`` is one, a bare singleton
(``python train.py``) is not (MPICH 5.0 gives every singleton the same identity, pmodels/mpich
#7805): docs/torch_backend.md says what to launch.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import time
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

from mpi4py import MPI

from ._config import check_environment, parse_timeout, setting
from ._torch_work import network_error
from .comm import use_world
from .errors import BackendUnavailable, InvalidArgument

__all__ = ["group_comm", "timeout_seconds", "rendezvous", "forget_world"]

_PORT_KEY = "cupycoll/port/{}"
_FAILED = "failed: "
#: every process of torch's default group, ordered by torch's rank (set when a cupycoll
#: default group is made); subgroups are made from it.
_world: MPI.Comm | None = None


def forget_world(mpi_comm: MPI.Comm) -> None:
    """The default group over ``mpi_comm`` is destroyed: later subgroups are cut from the next
    default group's world (or mpiexec's), not from this one's."""
    global _world
    if _world is mpi_comm:
        _world = None
        if isinstance(mpi_comm, _SeparateWorlds):
            use_world(None)


def timeout_seconds(group_timeout: datetime.timedelta | None,
                    environment: bool = True) -> float | None:
    """Seconds a wait of the group may take: the shorter of the group's timeout and
    ``CUPYCOLL_TIMEOUT`` (each where set and positive; ``environment=False``: the group's
    alone, the variables unread); None for no timeout."""
    limits = []
    if environment:
        check_environment()
        limits.append(parse_timeout(setting("CUPYCOLL_TIMEOUT")))
    if group_timeout is not None:
        limits.append(parse_timeout(group_timeout.total_seconds()))
    limits = [t for t in limits if t is not None]
    return min(limits) if limits else None


def group_comm(store: Any, rank: int, size: int, global_ranks: list[int],
               timeout: float | None) -> MPI.Comm:
    """The MPI communicator of a new process group, its ranks in the group's order (collective
    over the group's members).

    ``global_ranks`` (torch's default-group ranks of the members) is empty for the default
    group, whose creation also forms the world every later group is cut from.
    """
    global _world
    if not global_ranks:
        _world = _form_world(store, rank, size, timeout)
        return _world
    world = _world if _world is not None else _mpiexec_world(store, rank, global_ranks)
    members = world.Get_group().Incl(global_ranks)
    try:
        comm = world.Create_group(members)
    finally:
        members.Free()
    return type(world)(comm) if isinstance(world, _SeparateWorlds) else comm


class _SeparateWorlds(MPI.Intracomm):
    """A communicator joined from separately started MPI worlds, whose processes share no
    memory window even on one host (MPICH refuses ``Win.Allocate_shared`` across worlds): its
    ``Split_type`` puts each process in a node of its own, so cupycoll's arrival board reads
    every rank through RMA and node-aware code treats each rank as its own node."""

    def Split_type(self, split_type: int, key: int = 0,
                   info: MPI.Info = MPI.INFO_NULL) -> MPI.Intracomm:
        return self.Split(self.Get_rank(), key)


def _form_world(store: Any, rank: int, size: int, timeout: float | None) -> MPI.Comm:
    """Every process of the default group in one communicator, in torch's rank order."""
    processes = MPI.COMM_WORLD.Get_size()
    if processes == size:
        return MPI.COMM_WORLD.Split(0, rank)
    if processes == 1 and "Open MPI" in MPI.Get_library_version():
        raise network_error(BackendUnavailable(  # (every rank sees the same library: all raise)
            f"rank {rank}: Open MPI cannot connect processes started apart (each mpiexec "
            "has its own PMIx server, and Accept/Connect take no timeout there: they would "
            f"wait forever); launch with mpiexec -n {size}"))
    if processes == 1:  # (cupycoll's default communicator spans them too)
        joined = _SeparateWorlds(_connect_ports(store, rank, size, timeout))
        use_world(joined)
        return joined
    raise BackendUnavailable(
        f"rank {rank}: MPI's COMM_WORLD has {processes} processes but the process group has "
        f"{size}: launch one MPI process per rank (mpiexec -n {size}) or start each process "
        "apart (torchrun, each under mpiexec -n 1)")


def _mpiexec_world(store: Any, rank: int, global_ranks: list[int]) -> MPI.Comm:
    """COMM_WORLD, for a cupycoll subgroup of a default group of another backend: its
    processes and ranks must be torch's (mpiexec; processes started apart are joined only when
    the default group is cupycoll's). The members compare their MPI ranks through the group's
    store first, so where one differs every member raises (none waits in MPI for the others)."""
    import torch.distributed as dist

    processes, size = MPI.COMM_WORLD.Get_size(), dist.get_world_size()
    if processes != size:
        raise BackendUnavailable(
            f"rank {global_ranks[rank]}: MPI's COMM_WORLD has {processes} processes, torch's "
            f"default group {size}: launch with mpiexec, or make cupycoll the default group's "
            "backend (it joins processes started apart)")
    store.set(f"cupycoll.mpi_rank.{rank}", str(MPI.COMM_WORLD.Get_rank()))
    mpi_ranks = [int(store.get(f"cupycoll.mpi_rank.{r}")) for r in range(len(global_ranks))]
    differing = [(t, m) for t, m in zip(global_ranks, mpi_ranks) if t != m]
    if differing:
        bad, mpi_rank = differing[0]
        raise InvalidArgument(
            "rank", bad, f"torch's rank {bad} differs from MPI's ({mpi_rank}), seen by every "
            "member of the new group: give init_process_group MPI's rank, or make cupycoll "
            "the default group's backend", rank=bad)
    return MPI.COMM_WORLD


def _port_info(timeout: float | None) -> MPI.Info:
    """MPI_Info bounding an Accept or Connect by ``timeout`` seconds (MPICH's "timeout" key)."""
    info = MPI.Info.Create()
    if timeout is not None:
        info.Set("timeout", str(max(1, int(timeout))))
    return info


def _connect_ports(store: Any, rank: int, size: int, timeout: float | None) -> MPI.Comm:
    """Join ``size`` separately started processes: rank 0 opens a port and accepts ranks 1,
    2, ... in turn; each joins when the store hands it the port name, then accepts the later
    ones with the ranks already joined. Rank 0 closes the port when all have joined."""
    info = _port_info(timeout)
    try:
        if rank == 0:
            return _host_joining(store, size, info)
        port = store.get(_PORT_KEY.format(rank)).decode()
        if port.startswith(_FAILED):
            raise BackendUnavailable(f"rank {rank}: rank 0 could not join the ranks before "
                                     f"this one ({port[len(_FAILED):]})")
        try:
            world = _merged(MPI.COMM_SELF.Connect(port, info), high=True)
        except MPI.Exception as exc:
            raise _join_failed(rank, exc) from exc
        for _ in range(rank + 1, size):
            world = _merged(world.Accept(port, info), high=False)
        return world
    finally:
        info.Free()


def _host_joining(store: Any, size: int, info: MPI.Info) -> MPI.Comm:
    """Rank 0's side of :func:`_connect_ports`."""
    port = MPI.Open_port()
    world, joining = MPI.COMM_SELF, 1
    try:
        for joining in range(1, size):
            store.set(_PORT_KEY.format(joining), port)
            world = _merged(world.Accept(port, info), high=False)
        return world
    except MPI.Exception as exc:
        error = _join_failed(0, exc)
        for later in range(joining + 1, size):  # they wait on the store: tell them
            store.set(_PORT_KEY.format(later), _FAILED + str(error))
        raise error from exc
    finally:
        MPI.Close_port(port)


def _merged(inter: MPI.Intercomm, high: bool) -> MPI.Intracomm:
    merged = inter.Merge(high=high)
    inter.Free()
    return merged


def _join_failed(rank: int, exc: MPI.Exception) -> BaseException:
    reason = str(exc).strip().splitlines()[-1]
    hint = (" (every process is a bare MPI singleton: MPICH 5.0 cannot connect those, "
            "pmodels/mpich#7805; start each one under `mpiexec -n 1`, or launch with mpiexec)"
            if "check_disjoint_lpids" in str(exc) else "")
    return network_error(BackendUnavailable(
        f"rank {rank}: MPI could not connect the separately started processes{hint}: {reason}"))


#: seconds a process waits at exit for the others (:func:`_leave_together`)
LEAVE_WAIT = 30.0


def _leave_together(world: MPI.Comm) -> None:
    """At exit, wait (up to LEAVE_WAIT s) until every process of ``world`` is exiting: rank 0
    holds the TCPStore that the groups' stores (a gloo subgroup's too) are built on, and a
    process still tearing its groups down when rank 0's store went away could abort in C++
    ("terminate called without an active exception")."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    request = world.Ibarrier()
    deadline = time.monotonic() + LEAVE_WAIT
    while not request.Test() and time.monotonic() < deadline:
        time.sleep(1e-3)


def _number(text: str) -> int | str:
    """A query value as an int, else as given."""
    try:
        return int(text)
    except ValueError:
        return text


def rendezvous(url: str, timeout: datetime.timedelta = datetime.timedelta(minutes=30),
               **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """The ``cupycoll://[host]`` rendezvous: rank and world size from MPI's COMM_WORLD, and a
    TCPStore on rank 0 (at ``host``, else ``MASTER_ADDR``, else its hostname; a port the OS
    picks), whose address rank 0 broadcasts over MPI. A ``rank`` or ``world_size`` given to
    ``init_process_group`` must be MPI's."""
    import torch.distributed as dist

    parsed = urlparse(url)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    given = {name: _number(value[0]) for name, value in parse_qs(parsed.query).items()}
    wrong = [(name, given[name], mine) for name, mine in (("rank", rank), ("world_size", size))
             if given.get(name, mine) != mine]  # (not a number: wrong too)
    wrongs = [(r, w[0]) for r, w in enumerate(world.allgather(wrong)) if w]
    if wrongs:  # every rank raises: its own error, else the first rank's
        where, (name, value, mine) = wrong and (rank, wrong[0]) or wrongs[0]
        raise InvalidArgument(name, value, f"cupycoll:// takes it from MPI ({mine})" + (
            f" on rank {where}" if where != rank else ""), rank=rank)
    address = None
    if rank == 0:
        host = parsed.hostname or os.environ.get("MASTER_ADDR") or socket.gethostname()
        store = dist.TCPStore(host, 0, size, True, timeout=timeout, wait_for_workers=False)
        address = (host, store.port)
    host, port = world.bcast(address)
    if rank != 0:
        store = dist.TCPStore(host, port, size, False, timeout=timeout)
    if size > 1:
        atexit.register(_leave_together, world)
    yield store, rank, size
    raise RuntimeError("cupycoll:// does not rendezvous again (the MPI world is fixed)")
