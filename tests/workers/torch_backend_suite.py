"""PyTorch's backend-agnostic distributed tests (``distributed_test.py``) on the cupycoll group.

    python tests/workers/torch_backend_suite.py P RESULTS.jsonl [-k REGEX] [--limit N]
        [--backend gloo]

PyTorch runs ``DistributedTest._DistTestBase`` in processes it spawns itself (one MPI
singleton each here, which MPICH 5.0 cannot join: docs/torch_backend.md); this script runs the
same test methods under ``mpiexec -n P`` instead, every rank calling each test in turn, with
``BACKEND=cupycoll`` selecting what the suite skips, as PyTorch's own runner does for a backend
name. Per test, as PyTorch's runner: a fresh default group (``init_process_group`` through a
new FileStore), the suite's file barrier before and after, then ``destroy_process_group``.
Every rank's outcome (pass, skip and its reason, or the error) is appended by rank 0 to
RESULTS.jsonl. A job that dies or hangs (a test that deadlocks; ``CUPYCOLL_TIMEOUT`` turns
cupycoll's waits into errors first) is restarted after the test it was in, which is recorded
as "hung". Without arguments after P and RESULTS, every test runs; the summary prints counts.
``--backend gloo`` runs the same harness on gloo, to tell the harness's and the suite's own
limits (tests written for gloo or NCCL only) from the backend's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER_TIMEOUT = 240  # seconds one test may take before its job is killed and restarted


def test_names(selector: str | None) -> list[str]:
    """The suite's test methods (importing it needs BACKEND set)."""
    os.environ.setdefault("BACKEND", "cupycoll")
    os.environ.setdefault("WORLD_SIZE", "1")
    from torch.testing._internal.distributed.distributed_test import DistributedTest

    names = sorted(n for n in dir(DistributedTest._DistTestBase) if n.startswith("test_"))
    return [n for n in names if selector is None or re.search(selector, n)]


def outcome_of(case, name: str) -> str:
    """Run one test method on this rank; "pass", "skip: reason" or "fail: error"."""
    import unittest

    from torch.testing._internal.common_distributed import TEST_SKIPS

    try:
        getattr(case, name)()
        return "pass"
    except unittest.SkipTest as exc:
        return f"skip: {exc}"
    except SystemExit as exc:  # the suite's GPU and backend guards exit with a skip code
        reasons = {s.exit_code: s.message for s in TEST_SKIPS.values()}
        return f"skip: {reasons.get(exc.code, f'exit {exc.code}')}"
    except BaseException as exc:
        return f"fail: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}" \
            if str(exc).strip() else f"fail: {type(exc).__name__}"


def run_rank(names: list[str], results: str, backend: str) -> None:
    """Under mpiexec: run ``names`` in order on every rank, appending outcomes (rank 0)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    temp = world.bcast(tempfile.mkdtemp(prefix="cupycoll-suite-") if rank == 0 else None)
    os.environ.update(BACKEND=backend, WORLD_SIZE=str(size), TEMP_DIR=temp)
    if rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(temp, sub), exist_ok=True)
    world.Barrier()
    import torch.distributed as dist
    from torch.testing._internal.common_utils import set_rng_seed
    from torch.testing._internal.distributed.distributed_test import (Barrier, DistributedTest,
                                                                      TestDistBackend)

    import cupycoll._torch_backend  # noqa: F401  registers "cupycoll"

    class Case(DistributedTest._DistTestBase, TestDistBackend):
        pass

    for name in names:
        store = os.path.join(temp, f"store-{name}")
        case = Case(name)
        case.rank, case.file_name = rank, store
        set_rng_seed()  # the suite's seed on every rank, as its TestCase.setUp sets it
        Barrier.barrier_id = 0  # as in a freshly spawned process; rank 0 clears the files
        if rank == 0:
            Barrier.init()
        world.Barrier()
        start = time.monotonic()
        try:
            dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                                    world_size=size, timeout=datetime.timedelta(seconds=60))
            case._barrier()
            outcome = outcome_of(case, name)
            case._barrier()
        except BaseException as exc:
            outcome = f"fail: {type(exc).__name__}: {str(exc)[:200]} (around the test)"
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        every = world.gather(outcome, root=0)
        if rank == 0:
            with open(results, "a") as f:
                f.write(json.dumps({"test": name, "outcomes": every,
                                    "seconds": round(time.monotonic() - start, 2)}) + "\n")


def drive(size: int, results: str, names: list[str], backend: str) -> None:
    """Run ``names`` in mpiexec jobs until each has an outcome, restarting after a hang."""
    from cupycoll.jupyter import find_mpiexec

    done = set()
    if os.path.exists(results):
        done = {json.loads(line)["test"] for line in open(results)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), CUPYCOLL_TIMEOUT="60", OMP_NUM_THREADS="1")
    while True:
        todo = [n for n in names if n not in done]
        if not todo:
            break
        listing = Path(results + ".todo")
        listing.write_text("\n".join(todo))
        cmd = [find_mpiexec(), "-n", str(size), sys.executable, "-m", "mpi4py", __file__,
               "--rank", results, str(listing), backend]
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        last, seen = time.monotonic(), len(done)
        while proc.poll() is None:
            time.sleep(2)
            recorded = {json.loads(line)["test"] for line in open(results)} \
                if os.path.exists(results) else set()
            if len(recorded) > seen:
                last, seen = time.monotonic(), len(recorded)
            elif time.monotonic() - last > RUNNER_TIMEOUT:
                os.killpg(proc.pid, 9)
        done = {json.loads(line)["test"] for line in open(results)} \
            if os.path.exists(results) else set()
        stuck = next((n for n in todo if n not in done), None)
        if stuck is not None and proc.returncode != 0:
            with open(results, "a") as f:
                f.write(json.dumps({"test": stuck, "outcomes": ["hung or crashed"] * size,
                                    "seconds": RUNNER_TIMEOUT}) + "\n")
            done.add(stuck)
    summarize(results)


def summarize(results: str) -> None:
    """Print counts of tests that passed on every rank, were skipped, or failed."""
    counts: dict[str, int] = {"pass": 0, "skip": 0, "fail": 0}
    for line in open(results):
        outcomes = json.loads(line)["outcomes"]
        kind = "pass" if all(o == "pass" for o in outcomes) else \
            "skip" if all(o.startswith("skip") for o in outcomes) else "fail"
        counts[kind] += 1
    print(json.dumps(counts))


def main() -> None:
    if sys.argv[1] == "--rank":
        run_rank(Path(sys.argv[3]).read_text().split(), sys.argv[2], sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("size", type=int)
    parser.add_argument("results")
    parser.add_argument("-k", dest="selector")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--backend", default="cupycoll")
    args = parser.parse_args()
    os.environ["BACKEND"] = args.backend
    drive(args.size, args.results, test_names(args.selector)[:args.limit], args.backend)


if __name__ == "__main__":
    main()
