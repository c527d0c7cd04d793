"""The GPU path (NCCL backend, cupy primitives and kernels) on emulated GPUs:
cupycoll.testing.emulation.

Few, large mpiexec launches (each costs seconds): every suite at P = 1..4 with 2 emulated
devices per node (so local rank 1 runs on device 1), a quick subset at P = 8, the emulator's own
rules, and the defects it found (each of these modes failed before its fix; see the README).
"""

from __future__ import annotations

import pytest

from tests._mpi import run_mpi

pytestmark = pytest.mark.mpi


def _run(nprocs, modes, *args, timeout=300, settings=None, **env):
    env = {"CC_EMU_" + k.upper(): str(v) for k, v in env.items()}
    env.update(settings or {})
    out = run_mpi(nprocs, "gpu_emulated.py", ",".join(modes), *args, timeout=timeout, env=env)
    assert f"gpu_emulated {','.join(modes)}: ok on {nprocs} ranks" in out
    return out


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_suites_on_emulated_gpus(nprocs):
    """Dense, sparse (every algorithm, sync and async), top-k (every algorithm, Ok-Topk refresh
    and non-refresh) on init("nccl") against numpy references; the CUDA kernels ran (compiled
    for the CPU); NCCL call logs agree across ranks. At P >= 3 the node-aware algorithm sees
    nodes of 2 ranks (P = 3: the last one short), so its node and rail steps run on NCCL."""
    _run(nprocs, ["suites"], 60 + nprocs, 16, settings=_NODES_OF_2 if nprocs >= 3 else None)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_wire_formats_on_emulated_gpus(nprocs):
    """compact == coo bitwise for every sparse and top-k algorithm on the device path (the
    codec's kernels, packed uint8 messages over NCCL), bfloat16 values identical everywhere."""
    _run(nprocs, ["wire"], timeout=900)


def test_split_dense_regions_on_emulated_gpus(tmp_path):
    """split's sparse output gathered as dense regions and presence bits on the device path
    (NCCL's grouped broadcasts, cupy's packbits): a bytes-only profile makes it the cheaper
    gather for the cases with dense unions; results against the numpy references."""
    import json

    profile = tmp_path / "bytes_only.json"
    profile.write_text(json.dumps({"name": "bytes", "alpha_p2p": 0.0, "beta_p2p": 1.0,
                                   "alpha_native": 0.0, "beta_native": 1.0, "gamma": {}}))
    out = _run(3, ["suites"], 77, 24, "quick", settings={"CUPYCOLL_PROFILE": str(profile)},
               sparse="split")
    assert int(out.split("as dense regions: ")[1].split()[0]) > 0, out


def test_suites_on_8_emulated_gpus():
    _run(8, ["suites"], 68, 6, "quick", timeout=400, settings=_NODES_OF_2)


_NODES_OF_2 = {"CUPYCOLL_RANKS_PER_NODE": "2"}


@pytest.mark.parametrize("nprocs", [2, 3])
def test_rules_and_defects(nprocs):
    """The emulator catches device mismatches, host arrays, NCCL memory/units/overlap errors,
    unordered stream reads, log differences; abort unblocks (P = 2). Async sparse_allreduce on
    the communicator's device and in one launch order (defects 1, 2); dup() (3); a missing peer
    times out, a failed init raises everywhere (4), an init past its timeout aborts what it made;
    an array on another GPU on one rank
    raises on every rank; ``out`` overlapping ``x`` and a result read after the completer
    thread's wait."""
    modes = ["async_device", "async_order", "wrong_device", "dense_views", "missing_peer",
             "init_given_up", "init_fails"]
    if nprocs == 2:
        modes = ["rules", "dup"] + modes
    _run(nprocs, modes, timeout=200)


def test_dup_on_cupy13_binding_and_remote_abort():
    """Defect 3: CuPy 13's NcclCommunicator has no commSplit. Defect 4: a wait without timeout
    sees the abort of a peer on another node (one device per node: NCCL reports a dead peer
    only across nodes, a node-mate's abort leaves the kernel spinning)."""
    _run(2, ["dup", "peer_aborts"], cupy=13, devices=1, timeout=120)


def test_init_device_and_auto_backend():
    """init() keeps the device the application made current; init("auto") is agreed."""
    _run(2, ["device_choice", "auto_agrees"], devices=3, timeout=120)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_late_rank_named_and_interrupt_on_nccl(nprocs):
    """Issue 12 on the NCCL backend, one launch per P: a late rank is named in
    CollectiveTimeout.missing_ranks (arrival board) for every front door (dense verbs,
    sparse_allreduce sync and async, topk_allreduce, TopkCompressor.step; kernels warmed by a
    good call first, 1.5 s timeout: the late rank joins only after
    every punctual one has raised, so the timeout only has to cover their own arrival spread), the communicator is then dead at once; a late rank whose
    peers aborted never completes against them (strict NCCL: failed before the emulator
    cancelled an aborted communicator's operations); a wait with no timeout raises
    KeyboardInterrupt within 1 s of SIGINT. Defect 7: a fetch that failed (timeout, remote
    error) keeps the pinned buffer its queued device-to-host copy still writes (late_fetch;
    before, the late rank freed it and the copy wrote freed heap memory: malloc aborted, or
    its pickle buffer for WORLD.gather reused the block, once the agreement vector outgrew
    numpy's 1 KiB small-block cache). At P = 2 the two ranks are on two emulated nodes (one
    device each): a peer's abort reaches the late rank as NCCL's remote error; at P = 3 and 4
    (two devices per node) a node-mate's abort does not, and its own timeout ends its wait."""
    out = _run(nprocs, ["late_named", "late_after_abort", "late_verbs", "late_fetch",
                        "interrupt"], timeout=420, devices=1 if nprocs == 2 else 2)
    assert out.count("LATE ") == 12, out
