"""``cupycoll selftest``: the quick run end to end, the failure path, the runner, plans, oracles.

The quick run is what CI can afford (about a minute on 2 cores); without a GPU it runs the
emulated equivalents, which launch the very workers the GPU run launches (``--emulate``). The
GPU plan itself cannot run here: its plumbing (plan, estimate, report, JSON) is tested on its
own below.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cupycoll._result import SparseResult
from cupycoll.testing.selftest import _plan, plan
from cupycoll.testing.selftest._launch import launch
from cupycoll.testing.selftest._report import document, markdown
from cupycoll.testing.selftest._runner import Check, Context, Outcome, estimate, run_checks
from cupycoll.testing.selftest._w_compare import sparse_mismatch
from cupycoll.testing.selftest._w_dense import matches, reference

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
RECORD_KEYS = {"name", "ok", "seconds", "budget_s", "over_budget", "what", "detail"}


def selftest(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``python -m cupycoll selftest ARGS --json FILE``; return the process and the JSON."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"selftest-{os.getpid()}-{time.time_ns()}.json"
    try:
        proc = subprocess.run([sys.executable, "-m", "cupycoll", "selftest", *args, "--json",
                               str(out)], capture_output=True, text=True, timeout=timeout,
                              env=ENV, cwd=ROOT, start_new_session=True)
        doc = json.loads(out.read_text()) if out.is_file() else {}
    finally:
        out.unlink(missing_ok=True)
    return proc, doc


def test_quick_selftest_passes_and_writes_its_json():
    proc, doc = selftest("--quick", timeout=600)
    assert doc, f"no JSON written\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    failed = {c["name"]: c["detail"] for c in doc["checks"] if not c["ok"]}
    assert proc.returncode == 0 and not failed, f"{failed}\n{proc.stdout[-5000:]}"
    assert doc["ok"] is True and doc["quick"] is True
    assert isinstance(doc["gpu"], bool) and doc["gpu"] == (doc["device"]["count"] > 0)
    assert doc["checks"] and all(RECORD_KEYS <= set(c) for c in doc["checks"])
    assert all(isinstance(c["ok"], bool) and c["seconds"] > 0 for c in doc["checks"])
    assert doc["estimate_s"] == sum(c["budget_s"] for c in doc["checks"])
    rounding = 0.005 * (len(doc["checks"]) + 1)  # each figure is rounded to 0.01 s
    assert doc["total_s"] >= sum(c["seconds"] for c in doc["checks"]) - rounding
    names = [c["name"] for c in doc["checks"]]
    if not doc["gpu"]:  # what a GPU would run is listed, marked as such
        assert {"compile-sm90", "mpi-cupy-p2-emulated", "oktopk-buckets-p3-emulated"} <= set(
            names)
        assert any(n["reason"] == "needs a GPU" for n in doc["not_run"])
        compile_check = doc["checks"][names.index("compile-sm90")]
        assert [r["newly compiled"] for r in compile_check["table"]][1] == 0  # cached
    assert "## Summary" in proc.stdout and "**PASSED" in proc.stdout


def test_a_failing_check_gives_exit_status_1_and_ok_false():
    """--fail-check adds a check that always fails; --only runs no other check."""
    proc, doc = selftest("--only", "no-such-check", "--fail-check", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert doc["ok"] is False
    assert [(c["name"], c["ok"]) for c in doc["checks"]] == [("injected-failure", False)]
    assert "--fail-check" in doc["checks"][0]["detail"]
    assert any(n["reason"] == "not selected (--only)" for n in doc["not_run"])
    assert "**FAILED: injected-failure**" in proc.stdout


def test_list_prints_the_plan_and_the_estimate_and_runs_nothing():
    proc = subprocess.run([sys.executable, "-m", "cupycoll", "selftest", "--list"],
                          capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "- estimate: " in proc.stdout and "## Plan" in proc.stdout
    assert "## Results" not in proc.stdout


# ---------------------------------------------------------------- the runner, in process
def _ctx(tmp_path: Path) -> Context:
    return Context(quick=True, devices=0, source=None, tmp=tmp_path)


def test_runner_times_each_check_and_a_raising_check_fails_alone(tmp_path):
    def boom(ctx: Context) -> Outcome:
        raise RuntimeError("kaputt")

    checks = [Check("raises", 5, "raises", boom),
              Check("slow", 0.01, "sleeps past its budget",
                    lambda ctx: time.sleep(0.05) or Outcome(True, "slept")),
              Check("fine", 5, "passes", lambda ctx: Outcome(True, "fine", [{"a": 1}]))]
    records = run_checks(checks, _ctx(tmp_path))
    assert [(r["name"], r["ok"]) for r in records] == [("raises", False), ("slow", True),
                                                        ("fine", True)]
    assert "RuntimeError: kaputt" in records[0]["detail"]
    assert records[1]["over_budget"] and records[1]["seconds"] >= 0.05
    assert records[2]["table"] == [{"a": 1}] and not records[2]["over_budget"]
    assert estimate(checks) == 10.01


def test_launch_kills_a_hanging_child_at_its_timeout():
    start = time.perf_counter()
    done = launch([sys.executable, "-c", "import time; print('started', flush=True); "
                   "time.sleep(60)"], timeout=2)
    assert done.timed_out and not done.ok and time.perf_counter() - start < 30
    assert "timed out after 2 s" in done.failure() and "started" in done.failure()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_an_interrupted_selftest_kills_the_running_checks_processes(how, tmp_path):
    """Ctrl-C or SIGTERM to the selftest while a check's launch runs: the launch's process
    group (in a session of its own, which neither signal reaches) is killed, not left running."""
    import signal

    marker = tmp_path / "child.pid"
    child_code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); " \
        "time.sleep(120)"
    stack = tmp_path / "stack.txt"
    script = tmp_path / "selftest_like.py"
    script.write_text(  # the signals as a terminal's shell leaves them, whatever pytest's are;
        # SIGUSR1 dumps the stacks should it not end
        "import faulthandler, signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"faulthandler.register(signal.SIGUSR1, open({str(stack)!r}, 'w'), all_threads=True)\n"
        "from cupycoll.testing.selftest import _terminated_as_exit\n"
        "from cupycoll.testing.selftest._launch import launch\n"
        "with _terminated_as_exit():\n"
        f"    launch([sys.executable, '-c', {child_code!r}], timeout=200)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(marker.read_text())
    proc.send_signal(getattr(signal, how))
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        status = [ln for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                  if ln.startswith("Sig")]
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        proc.kill()
        with contextlib.suppress(ProcessLookupError):  # (the stacks and stderr matter)
            os.kill(child, signal.SIGKILL)
        pytest.fail(f"still running 60 s after {how}: {status}\n{stack.read_text()}\n"
                    f"{proc.communicate()[1]}")
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or \
        Path(f"/proc/{child}/stat").read_text().split()[2] == "Z", "the check's child lives on"


def test_launch_runs_in_the_package_root_not_the_callers_folder(tmp_path, monkeypatch):
    """A worker runs ``python -m``, which puts its folder first on the path: it runs in the
    folder holding the cupycoll the selftest runs, not in the caller's (which may hold
    another cupycoll)."""
    from cupycoll.testing.selftest._launch import PACKAGE_ROOT

    (tmp_path / "cupycoll").mkdir()
    (tmp_path / "cupycoll" / "__init__.py").write_text("raise ImportError('a shadow')\n")
    monkeypatch.chdir(tmp_path)
    done = launch([sys.executable, "-c", "import os, cupycoll; print(os.getcwd())"], timeout=60)
    assert done.ok and done.stdout.strip() == str(PACKAGE_ROOT), done.failure()


def test_a_selftest_that_ran_no_check_is_not_ok():
    """No check ran (``--quick`` without CuPy, an ``--only`` matching nothing): not ok, and the
    report says so instead of PASSED."""
    doc = document("emulated", {"count": 0}, [], [], [], 0.0, True, 0.1, None)
    assert doc["ok"] is False
    assert "FAILED: no check ran here" in markdown(doc, [], [])


def test_launch_lets_open_mpi_oversubscribe_unless_the_caller_says_otherwise(monkeypatch):
    """Checks of 3-8 ranks on fewer cores: Open MPI's mpiexec refuses them ("not enough slots")
    unless told to oversubscribe, as MPICH does by itself; a caller's own value is kept."""
    from cupycoll.jupyter import OVERSUBSCRIBE

    show = "import os; print([os.environ.get(k) for k in %r])" % sorted(OVERSUBSCRIBE)
    for name in OVERSUBSCRIBE:
        monkeypatch.delenv(name, raising=False)
    want = [OVERSUBSCRIBE[k] for k in sorted(OVERSUBSCRIBE)]
    assert launch([sys.executable, "-c", show], timeout=60).stdout.strip() == str(want)
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "0")
    got = launch([sys.executable, "-c", show], timeout=60).stdout.strip()
    assert got == str([v if k != "OMPI_MCA_rmaps_base_oversubscribe" else "0"
                       for k, v in sorted(OVERSUBSCRIBE.items())])


def test_report_ends_with_the_summary_and_the_verdict(tmp_path):
    checks = [Check("good", 3, "a good check", lambda ctx: Outcome(True, "all fine")),
              Check("bad", 4, "a bad check", lambda ctx: Outcome(False, "line 1\nline 2"))]
    records = run_checks(checks, _ctx(tmp_path))
    doc = document("emulated", {"count": 0, "why": "none here"}, checks, records, [], 475.0,
                   True, 1.5, None)
    assert doc["ok"] is False and doc["estimate_s"] == 7 and doc["gpu"] is False
    text = markdown(doc, checks, [])
    assert text.index("- estimate: 7 s") < text.index("## Results") < text.index("## Summary")
    assert "| bad | FAILED |" in text and "**FAILED: bad** (1 of 2 checks ok" in text
    assert "```\nline 1\nline 2\n```" in text  # a multi-line detail keeps its lines
    json.dumps(doc)
    gpu = {"count": 1, "name": "NVIDIA H200", "compute_capability": "9.0", "memory_gib": 139.8,
           "peak_bandwidth_gbs": 4800.0, "cupy": "14.2.0"}
    doc = document("gpu", gpu, checks, records[:1], [], 7.0, False, 1.0, str(ROOT))
    assert doc["gpu"] is True and doc["ok"] is True
    text = markdown(doc, checks[:1], [])
    assert ("GPU: 1 x NVIDIA H200 (compute capability 9.0, 139.8 GiB, peak 4800.0 GB/s)"
            in text and "**PASSED: every check that ran is ok** (1 of 1" in text)
    assert "estimate of the GPU run" not in text


# ---------------------------------------------------------------- the plans
def test_one_gpu_plan_fits_ten_minutes_and_lists_the_multi_gpu_checks():
    checks, not_run = _plan.gpu_plan(1, ROOT)
    names = [c.name for c in checks]
    assert names == ["gpu-tests", "compile", "nccl-dense-p1", "mpi-cupy-p2", "mpi-cupy-p4",
                     "throughput", "host-syncs", "host-time-p1"]
    assert estimate(checks) <= 600
    assert {n.name for n in not_run} == {"nccl-suites-nvls1", "nccl-suites-nvls0",
                                         "oktopk-buckets"}
    assert all(n.reason.startswith("needs 2 or more GPUs") for n in not_run)


def test_multi_gpu_plan_runs_the_suites_at_the_gpu_count_with_nvls_on_and_off():
    checks, not_run = _plan.gpu_plan(4, ROOT)
    extra = {c.name: c.what for c in checks[-3:]}
    assert not not_run and set(extra) == {"nccl-suites-nvls1", "nccl-suites-nvls0",
                                          "oktopk-buckets"}
    assert "on 4 GPUs, NCCL_NVLS_ENABLE=1" in extra["nccl-suites-nvls1"]
    assert "(4 overlap buckets)" in extra["oktopk-buckets"]


def test_an_installed_copy_says_which_checks_need_the_source_tree():
    checks, not_run = _plan.gpu_plan(2, None)
    reasons = {n.name: n.reason for n in not_run}
    assert reasons == {"gpu-tests": _plan.NO_SOURCE, "nccl-suites-nvls1": _plan.NO_SOURCE,
                       "nccl-suites-nvls0": _plan.NO_SOURCE}
    assert "oktopk-buckets" in [c.name for c in checks]  # a worker of the package: runs
    mode, checks, not_run, gpu_estimate = plan(0, None, False)
    assert mode == "emulated" and estimate(checks) <= 600
    assert {n.name for n in not_run if n.reason == _plan.NO_SOURCE} == {
        "kernels-cpu-tier", "emulated-suites-p2", "emulated-suites-p3"}
    assert "compile" in {n.name for n in not_run if n.reason == "needs a GPU"}
    assert {n.name: n.reason for n in not_run}["gpu-tests"] == f"needs a GPU; {_plan.NO_SOURCE}"
    assert "host-syncs" in [c.name for c in checks]  # runs here: not also "needs a GPU"
    assert gpu_estimate == estimate(_plan.gpu_plan(1, None)[0])


def test_without_cupy_the_emulated_checks_are_listed_as_not_run(monkeypatch):
    """The emulation tier runs CuPy's code: without CuPy its checks are not run, with the
    install hint; the kernels on the CPU shim need no CuPy and still run."""
    real = _plan.importlib.util.find_spec
    monkeypatch.setattr(_plan.importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else real(name, *a))
    checks, not_run = _plan.emulated_plan(ROOT)
    assert [c.name for c in checks] == ["kernels-cpu-tier"]
    assert len(not_run) == 10 and {n.reason for n in not_run} == {_plan.NO_CUPY}
    assert "pip install 'cupycoll[gpu-cu12]'" in _plan.NO_CUPY
    checks, not_run = _plan.emulated_plan(ROOT, True)
    assert not checks and len(not_run) == 5 and {n.reason for n in not_run} == {_plan.NO_CUPY}


# ---------------------------------------------------------------- the workers' oracles
def test_dense_reference_truncates_integer_avg_and_matches_compares_bits():
    stack = np.array([[-3, 3, 5], [2, -2, 2]], np.int8)
    assert reference(stack, "avg").tolist() == [0, 0, 3]  # -0.5, 0.5, 3.5 toward zero
    assert reference(stack, "prod").tolist() == [-6, -6, 10]
    floats = stack.astype(np.float16)
    assert matches(reference(floats, "sum"), np.array([-1, 1, 7], np.float16), "sum", 2)
    assert not matches(np.array([-0.0, 1, 7], np.float16), np.array([0.0, 1, 7], np.float16),
                       "sum", 2)  # the sign of zero counts
    third = np.float32(1) / np.float32(3)
    near = np.nextafter(third, np.float32(1))
    assert matches(np.array([near]), np.array([third]), "avg", 3)  # within 3 ulps
    assert not matches(np.array([np.float32(0.34)]), np.array([third]), "avg", 3)


def test_sparse_reference_holds_sums_to_their_rounding_bound():
    inputs = [(np.array([1, 4]), np.array([1.0, 2.0], np.float32)),
              (np.array([4]), np.array([2 ** -24], np.float32))]
    exact = SparseResult(np.array([1, 4]), np.array([1.0, 2.0], np.float32), 8)
    assert sparse_mismatch(exact, inputs, "sum", 2, None) is None  # 2 + 2^-24 rounds to 2
    two_ulps = np.nextafter(np.nextafter(np.float32(2), 3), 3)  # the bound is 1 ulp at P = 2
    off = SparseResult(np.array([1, 4]), np.array([1.0, two_ulps], np.float32), 8)
    assert "beyond the rounding bound" in sparse_mismatch(off, inputs, "sum", 2, None)
    wrong = SparseResult(np.array([1]), np.array([1.0], np.float32), 8)
    assert "indices differ" in sparse_mismatch(wrong, inputs, "sum", 2, None)
    assert sparse_mismatch(exact, inputs, "max", 2, None) is None
    assert sparse_mismatch(off, inputs, "max", 2, None) == "values differ from numpy's"


@pytest.mark.parametrize("op", ["max", "min"])
def test_sparse_reference_counts_an_absent_entry_as_zero(op):
    inputs = [(np.array([0]), np.array([-3.0], np.float32)), (np.array([1]),
                                                               np.array([5.0], np.float32))]
    want = {"max": [0.0, 5.0], "min": [-3.0, 0.0]}[op]
    got = SparseResult(np.array([0, 1]), np.array(want, np.float32), 4)
    assert sparse_mismatch(got, inputs, op, 2, None) is None


def test_docs_list_every_check_with_its_budget():
    """docs/selftest.md says exactly what runs: every check of every plan, with its budget."""
    text = (ROOT / "docs" / "selftest.md").read_text()
    for checks in (_plan.gpu_plan(2, ROOT)[0], _plan.emulated_plan(ROOT)[0]):
        for c in checks:
            assert f"| `{c.name}` | {c.budget_s:g} |" in text, c.name
    for checks in (_plan.gpu_plan(1, ROOT, True)[0], _plan.emulated_plan(ROOT, True)[0]):
        for c in checks:
            assert f"`{c.name}` ({c.budget_s:g}" in text, c.name
    for devices in (1, 2):
        assert f"{estimate(_plan.gpu_plan(devices, ROOT)[0]):.0f} s" in text
    assert f"Estimate: {estimate(_plan.emulated_plan(ROOT)[0]):.0f} s." in text


# ---------------------------------------------------------------- deadline, interruption, CUDA
def _main(monkeypatch, tmp_path, checks, *args, device=None):
    """Run the selftest's ``main`` in process on ``checks`` (the plan replaced); return its
    exit status and the JSON document it wrote."""
    import argparse

    import cupycoll.testing.selftest as st

    monkeypatch.setattr(st, "probe", lambda: device or {"count": 0, "why": "none here"})
    monkeypatch.setattr(st, "plan", lambda devices, source, quick: ("emulated", list(checks),
                                                                     [], 0.0))
    parser = argparse.ArgumentParser()
    st.add_arguments(parser)
    out = tmp_path / "st.json"
    try:
        status = st.main(parser.parse_args([*args, "--json", str(out)]))
    except (KeyboardInterrupt, SystemExit) as exc:
        pytest.fail(f"main() let {exc!r} through")
    return status, json.loads(out.read_text())


def test_a_deadline_starts_only_the_checks_whose_budget_the_time_left_covers(
        monkeypatch, tmp_path):
    ran = []
    checks = [Check("first", 1, "quick", lambda ctx: ran.append(ctx.timeout(100)) or
                    Outcome(True, "fine")),
              Check("second", 100, "longer than the deadline leaves",
                    lambda ctx: ran.append("second") or Outcome(True, "fine"))]
    status, doc = _main(monkeypatch, tmp_path, checks, "--deadline", "5")
    assert status == 0 and doc["ok"] and [c["name"] for c in doc["checks"]] == ["first"]
    assert len(ran) == 1 and ran[0] <= 5  # its launches end by the deadline
    assert [(n["name"], n["reason"].split(":")[0]) for n in doc["not_run"]] == [
        ("second", "not finished")] and "--deadline 5 s" in doc["not_run"][0]["reason"]
    late = Context(quick=True, devices=0, source=None, tmp=tmp_path, deadline=time.monotonic())
    assert late.timeout(100) == 1.0 and run_checks(checks, late) == []


def test_an_interrupted_selftest_still_writes_the_checks_that_finished(monkeypatch, tmp_path):
    """Ctrl-C (or SIGTERM, raised as SystemExit(143)) in the second check: the JSON holds the
    first one's record, the run is not ok, and the exit status is the signal's."""
    for stop, status_wanted in ((KeyboardInterrupt(), 130), (SystemExit(143), 143)):
        def interrupted(ctx: Context, stop=stop) -> Outcome:
            raise stop

        checks = [Check("first", 1, "fine", lambda ctx: Outcome(True, "fine")),
                  Check("second", 1, "interrupted", interrupted),
                  Check("third", 1, "never started", lambda ctx: Outcome(True, "fine"))]
        status, doc = _main(monkeypatch, tmp_path, checks)
        assert status == status_wanted and doc["ok"] is False, doc
        assert [c["name"] for c in doc["checks"]] == ["first"]
        assert doc["interrupted"].startswith("interrupted")
        assert [n["name"] for n in doc["not_run"]] == ["second", "third"]


def test_a_broken_cuda_fails_the_selftest(monkeypatch, tmp_path):
    """CUDA installed but broken (the probe's ``broken``): the emulated checks run, and a failed
    check says why, so the run is not ok."""
    broken = {"count": 0, "why": "getDeviceCount() raised CUDARuntimeError: 803",
              "broken": "getDeviceCount() raised CUDARuntimeError: 803"}
    checks = [Check("fine", 1, "fine", lambda ctx: Outcome(True, "fine"))]
    status, doc = _main(monkeypatch, tmp_path, checks, device=broken)
    assert status == 1 and doc["ok"] is False
    assert [(c["name"], c["ok"]) for c in doc["checks"]] == [("cuda-runtime", False),
                                                             ("fine", True)]
    assert "CUDA is installed but broken" in doc["checks"][0]["detail"]


def test_the_compile_check_stops_after_a_failed_cold_launch(monkeypatch, tmp_path):
    """A cold launch that failed (or timed out) is not followed by the cached one."""
    from cupycoll.testing.selftest import _checks

    class Failed:
        ok, timed_out = False, True

        def result(self):
            return None

        def shown(self):
            return "cmd"

        def failure(self):
            return "timed out after 120 s"

    launched = []
    monkeypatch.setattr(_checks, "launch", lambda *a, **k: launched.append(a) or Failed())
    outcome = _checks.compile_check("compile", 40, True, False).run(_ctx(tmp_path))
    assert not outcome.ok and "timed out" in outcome.detail and len(launched) == 1
