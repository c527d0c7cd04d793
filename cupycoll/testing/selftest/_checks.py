"""The selftest's checks: each one builds its command(s), launches them, and reads the result.

Every check takes ``emulated``: the same worker runs on the GPU, or with ``--emulate D`` on the
emulation tier (:mod:`cupycoll.testing.emulation`), which is how the no-GPU selftest runs the
very code paths of the GPU one. Checks that need the source tree (``tests/``) are only planned when it is
there (:mod:`._plan` lists them as not run otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from ._launch import Launch, launch, script_command, worker_command
from ._runner import Check, Context, Outcome

__all__ = ["pytest_check", "compile_check", "dense_check", "compare_check", "throughput_check",
           "syncs_check", "host_time_check", "oktopk_check", "suites_check", "failing_check",
           "gpu_test_files"]


def _emulate(emulated: bool, devices: int) -> list[str]:
    return ["--emulate", str(devices)] if emulated else []


def _failures(result: dict) -> str:
    lines = result.get("failures") or []
    more = result.get("failed", len(lines)) - len(lines)
    return "\n".join(lines) + (f"\n... and {more} more" if more > 0 else "")


def worker_check(name: str, budget: float, what: str, module: str, args: list[str],
                 nprocs: int, summary: Callable[[dict], str],
                 table: Callable[[dict], list | None] = lambda r: None) -> Check:
    """A check of one worker launch: ok when the worker exits 0 and reports ok."""
    def run(ctx: Context) -> Outcome:
        done = launch(worker_command(module, args, nprocs), ctx.timeout(budget))
        return _from_worker(done, summary, table)
    return Check(name, budget, what, run)


def _from_worker(done: Launch, summary: Callable[[dict], str],
                 table: Callable[[dict], list | None]) -> Outcome:
    result = done.result() if done.ok else None
    if result is None:
        return Outcome(False, done.failure() if not done.ok else
                       f"no result line from the worker: {done.shown()}", commands=[done.shown()])
    text = summary(result) if result["ok"] else _failures(result) or summary(result)
    return Outcome(bool(result["ok"]), text, table(result), [done.shown()],
                   {"result": {k: v for k, v in result.items() if k not in ("rows",
                                                                            "failures")}})


# ---------------------------------------------------------------- pytest
def gpu_test_files(source: Path) -> list[str]:
    """The test files holding ``gpu``-marked tests (the ones that skip without a device)."""
    return sorted(str(p.relative_to(source)) for p in (source / "tests").glob("test_*.py")
                  if "mark.gpu" in p.read_text())


def pytest_check(name: str, budget: float, what: str, files: Callable[[Path], list[str]],
                 marker: str | None) -> Check:
    """``python -m pytest -q [-m marker] FILES`` in the source tree, up to 4 test processes
    (one per core) where pytest-xdist is installed (addopts cleared: the same command runs
    without it)."""
    def run(ctx: Context) -> Outcome:
        assert ctx.source is not None
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        if importlib.util.find_spec("xdist") is not None:
            cmd += ["-n", str(min(4, os.cpu_count() or 1))]
        cmd += (["-m", marker] if marker else []) + files(ctx.source)
        done = launch(cmd, ctx.timeout(budget), cwd=ctx.source)
        tail = [ln for ln in done.stdout.splitlines()
                if re.search(r"\d+ (passed|failed|error|skipped|deselected)", ln)]
        summary = tail[-1].strip("= ") if tail else "no pytest summary line"
        return Outcome(done.ok, summary if done.ok else done.failure(), commands=[done.shown()])
    return Check(name, budget, what, run)


# ---------------------------------------------------------------- compile time
def compile_check(name: str, budget: float, emulated: bool, every: bool) -> Check:
    """A first call's kernel compile time into an empty ``CUPY_CACHE_DIR`` (cold), then again in
    a second process from that cache (cached: nothing may compile)."""
    args = _emulate(emulated, 1) + (["--arch", "sm_90"] if emulated else [])
    args += ["--all"] if every else []
    where = "NVRTC for sm_90, the kernels run on the emulation tier" if emulated else "the GPU"
    what = (f"first sparse_allreduce + Ok-Topk step: kernel compile time cold (empty "
            f"CUPY_CACHE_DIR) and cached ({where})"
            + ("; then every instantiation of every kernel file alone" if every else ""))

    def run(ctx: Context) -> Outcome:
        cache = ctx.tmp / "compile-cache"
        env = {"CUPY_CACHE_DIR": str(cache)}
        runs = [launch(worker_command("_w_compile", args, 1), ctx.timeout(budget), env=env)]
        if runs[0].ok and runs[0].result() is not None:  # a failed cold run ends the check
            runs.append(launch(worker_command("_w_compile", args, 1), ctx.timeout(budget),
                               env=env))
        commands = [f"{label}: {r.shown()}" for label, r in zip(("cold", "cached"), runs)]
        bad = [r for r in runs if not r.ok or r.result() is None]
        if bad:
            return Outcome(False, bad[0].failure(), commands=commands)
        cold, cached = (r.result() for r in runs)
        ok = cold["compiled"] > 0 and cached["compiled"] == 0 == cached.get("all_compiled", 0)
        rows = [_compile_row(label, r) for label, r in (("cold", cold), ("cached", cached))]
        detail = (f"{cold['instantiations']} instantiations for {cold['arch']}: first calls "
                  f"{cold['first_call_s']:.2f} s cold (compiling {cold['compile_s']:.2f} s, "
                  f"{cold['compiled']} cubins written), {cached['first_call_s']:.2f} s cached "
                  f"({cached['compiled']} compiled)")
        if not ok:
            detail += ": the cold run must compile and the cached run must not"
        return Outcome(ok, detail, rows, commands, {"launched": cold["launched"]})
    return Check(name, budget, what, run)


def _compile_row(label: str, r: dict) -> dict:
    row = {"cache": label, "first calls (s)": r["first_call_s"], "in compiled() (s)":
           r["compile_s"], "instantiations": r["instantiations"], "newly compiled":
           r["compiled"]}
    if "all_s" in r:
        row["every instantiation (s)"] = r["all_s"]
        row["of which compiled"] = f"{r['all_compiled']} of {r['all_instantiations']}"
    return row


# ---------------------------------------------------------------- correctness on the device
def dense_check(name: str, budget: float, emulated: bool) -> Check:
    tier = "emulated NCCL" if emulated else "NCCL on the GPU"
    return worker_check(
        name, budget, f"every dense verb, dtype and op at P = 1 on {tier} against numpy "
        "(new, in place, async)", "_w_dense", _emulate(emulated, 1), 1,
        lambda r: f"{r['calls']} calls at P = {r['P']}: every result equals numpy's")


def compare_check(name: str, budget: float, emulated: bool, nprocs: int, quick: bool) -> Check:
    tier = "one emulated device" if emulated else "one GPU"
    return worker_check(
        name, budget, f"{nprocs} processes sharing {tier}, MPI backend: every sparse and top-k "
        "algorithm on cupy arrays, bit for bit the numpy call, sparse sums vs numpy's",
        "_w_compare", _emulate(emulated, 1) + (["--quick"] if quick else []), nprocs,
        lambda r: f"{r['sparse_calls']} sparse calls ({len(r['sparse'])} algorithms) and "
                  f"{r['topk_calls']} top-k steps ({len(r['topk'])} algorithms) at P = {r['P']}"
                  ": cupy == numpy bit for bit, sparse within the rounding bound")


def oktopk_check(name: str, budget: float, emulated: bool, nprocs: int, steps: int) -> Check:
    tier = "emulated NCCL" if emulated else "NCCL"
    return worker_check(
        name, budget, f"Ok-Topk on {tier} at P = {nprocs} with THROTTLE = 1 ({nprocs} overlap "
        "buckets), bit for bit the MPI backend's, refresh and non-refresh steps",
        "_w_oktopk", _emulate(emulated, nprocs) + ["--steps", str(steps)], nprocs,
        lambda r: f"{r['steps']} steps (refresh: {r['refresh_steps']}) at P = {r['P']} in "
                  f"{r['buckets']} buckets, k = {r['k']}: NCCL == MPI bit for bit")


# ---------------------------------------------------------------- speed
def throughput_check(name: str, budget: float, emulated: bool, log2n: int, reps: int) -> Check:
    what = (f"kernel throughput table, n = 2^{log2n}, against the device's memory bandwidth"
            if not emulated else f"the throughput table's code on the emulation tier, n = "
            f"2^{log2n} (CPU times; each result compared with the numpy twin)")
    return worker_check(
        name, budget, what, "_w_throughput",
        _emulate(emulated, 1) + ["--log2n", str(log2n), "--reps", str(reps)], 1,
        lambda r: f"{len(r['rows'])} kernels, every result equal to numpy's; peak "
                  f"{r['peak_gbs'] or 'n/a'} GB/s",
        lambda r: r["rows"])


def host_time_check(name: str, budget: float, emulated: bool, iters: int) -> Check:
    tier = "emulated NCCL (the emulator's times)" if emulated else "NCCL on the GPU"
    return worker_check(
        name, budget, f"host time per call at P = 1 on {tier}: blocking and enqueue-only",
        "_w_host", _emulate(emulated, 1) + ["--iters", str(iters)], 1,
        lambda r: f"{len(r['rows'])} calls, median of {r['iters']}", lambda r: r["rows"])


def syncs_check(name: str, budget: float, nprocs: int) -> Check:
    """``cupycoll bench syncs --backend emulated``: host syncs per call vs the budget."""
    what = (f"host synchronisations per call at P = {nprocs} (bench_syncs.py on the real NCCL "
            "backend over the emulation tier), against the budget")

    def run(ctx: Context) -> Outcome:
        from ..._bench_scripts import bench_script

        out = ctx.tmp / "syncs.json"
        cmd = script_command(bench_script("syncs"), ["--backend", "emulated", "--json",
                                                     str(out)], nprocs)
        done = launch(cmd, ctx.timeout(budget))
        rows = json.loads(out.read_text())["rows"] if out.is_file() else []
        table = [{k: r[k] for k in ("call", "host_syncs", "min", "budget", "status")}
                 for r in rows]
        budgeted = [r for r in rows if r["budget"] is not None]
        detail = ", ".join(f"{r['call']} {r['host_syncs']}/{r['budget']}" for r in budgeted)
        return Outcome(done.ok and bool(rows), detail if done.ok else done.failure(),
                       table or None, [done.shown()])
    return Check(name, budget, what, run)


# ---------------------------------------------------------------- the suites of tests/workers
def suites_check(name: str, budget: float, nprocs: int, real_gpu: bool, nvls: str | None,
                 ncases: int, quick: bool) -> Check:
    """``tests/workers/gpu_emulated.py suites`` (dense, sparse, top-k on init("nccl")): on real
    GPUs with CC_REAL_GPU=1 (and NCCL_NVLS_ENABLE), else on the emulation tier."""
    env: dict[str, Any] = {"CC_REAL_GPU": "1"} if real_gpu else {}
    if nvls is not None:
        env["NCCL_NVLS_ENABLE"] = nvls
    if not real_gpu and nprocs >= 3:
        env["CUPYCOLL_RANKS_PER_NODE"] = "2"  # node-aware algorithms see nodes (as the tests)
    tier = f"{nprocs} GPUs" if real_gpu else f"{nprocs} emulated GPUs"
    what = (f"tests/workers/gpu_emulated.py suites (dense, sparse, top-k vs numpy) on {tier}"
            + (f", NCCL_NVLS_ENABLE={nvls}" if nvls is not None else "")
            + (" (quick)" if quick else ""))

    def run(ctx: Context) -> Outcome:
        assert ctx.source is not None
        script = ctx.source / "tests" / "workers" / "gpu_emulated.py"
        args = ["suites", str(60 + nprocs), str(ncases)] + (["quick"] if quick else [])
        done = launch(script_command(script, args, nprocs), ctx.timeout(budget),
                      env={k: str(v) for k, v in env.items()}, cwd=ctx.source)
        want = f"gpu_emulated suites: ok on {nprocs} ranks"
        ok = done.ok and want in done.stdout
        times = "; ".join(ln for ln in done.stdout.splitlines() if ln.endswith(" s"))
        return Outcome(ok, f"{want} ({times})" if ok else done.failure(),
                       commands=[done.shown()])
    return Check(name, budget, what, run)


def failing_check() -> Check:
    """A check that always fails: ``--fail-check`` adds it, to test the failure path (exit
    status 1, ``"ok": false``) without breaking anything."""
    return Check("injected-failure", 1, "a deliberately failing check (--fail-check, for "
                 "testing the selftest itself)",
                 lambda ctx: Outcome(False, "failed on purpose: --fail-check was given"))


def broken_cuda_check(why: str) -> Check:
    """A failed check saying CUDA is installed but broken (``probe`` found a driver and an
    error other than "no device"): the emulated checks run, and the run is not ok."""
    return Check("cuda-runtime", 1, "CUDA answers as a GPU machine's should (device count and "
                 "properties)", lambda ctx: Outcome(False, f"CUDA is installed but broken: "
                                                   f"{why}; the emulated checks ran instead"))
