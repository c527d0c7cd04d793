"""The skip policy of tests/conftest.py and tests/_gpu.py can fail a run; tests/_cpu_times.py
counts what a test costs; tests/_mpi.py's batches keep each worker's output apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cupycoll.testing.selftest import _device
from tests import _gpu
from tests._mpi import ROOT, Batch


def _pytest_on(tmp_path, body: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_probe.py"
    test.write_text("import pytest\n\n" + body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest",
                           "-p", "no:cacheprovider", str(test)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_a_skip_for_another_reason_fails_the_session(tmp_path):
    proc = _pytest_on(tmp_path, "def test_x():\n    pytest.skip('nvcc not on PATH')\n")
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout
    assert "1  nvcc not on PATH" in proc.stdout and "other than 'no CUDA device'" in proc.stdout


def test_a_skip_for_a_missing_device_passes(tmp_path):
    proc = _pytest_on(tmp_path, "def test_x():\n    pytest.skip('no CUDA device: none here')\n")
    assert proc.returncode == 0, proc.stdout
    assert "1  no CUDA device: none here" in proc.stdout


class _FakeRuntime:
    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            super().__init__(f"status {status}")
            self.status = status

    def __init__(self, status=None, count=0, query_status=None):
        self.status, self.count, self.query_status = status, count, query_status

    def getDeviceCount(self):
        if self.status is not None:
            raise self.CUDARuntimeError(self.status)
        return self.count

    def getDeviceProperties(self, device):
        if self.query_status is not None:
            raise self.CUDARuntimeError(self.query_status)
        return {"name": b"Fake GPU", "major": 9, "minor": 0, "totalGlobalMem": 2**37}

    def runtimeGetVersion(self):
        return 12080

    driverGetVersion = runtimeGetVersion

    def deviceGetAttribute(self, attribute, device):
        return {36: 2_619_000, 37: 6144}[attribute]


@pytest.fixture
def fake_cupy(monkeypatch):
    """Install a stand-in cupy whose getDeviceCount behaves as each test says."""
    import types

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=_FakeRuntime()),
                                 __version__="14.0.0")
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake.cuda


NO_DEVICE_CASES = [
    (_device.CUDA_ERROR_NO_DEVICE, True, True),
    (_device.CUDA_ERROR_INSUFFICIENT_DRIVER, False, True),   # no driver installed: no device
    (_device.CUDA_ERROR_INSUFFICIENT_DRIVER, True, False),   # a driver too old: a failure
    (803, True, False),                                      # a driver mismatch: a failure
    (999, False, False)]                                     # anything else: a failure


@pytest.mark.parametrize("status,driver,skips", NO_DEVICE_CASES)
def test_only_no_device_errors_skip(fake_cupy, monkeypatch, status, driver, skips):
    fake_cupy.runtime = _FakeRuntime(status)
    monkeypatch.setattr(_device, "_driver_installed", lambda: driver)
    if skips:
        assert _gpu.no_device_reason().startswith(_gpu.NO_DEVICE)
    else:
        with pytest.raises(pytest.fail.Exception, match="broken"):
            _gpu.no_device_reason()


@pytest.mark.parametrize("status,driver,absent", NO_DEVICE_CASES)
def test_the_selftest_calls_a_broken_cuda_broken(fake_cupy, monkeypatch, status, driver, absent):
    """The selftest's probe follows the same rule: no device runs the emulated checks; a CUDA
    that is installed and answers with another error is ``broken`` (a failed check, so the run
    is not ok), whether the count or the device query raises."""
    fake_cupy.runtime = _FakeRuntime(status)
    monkeypatch.setattr(_device, "_driver_installed", lambda: driver)
    found = _device.probe()
    assert found["count"] == 0 and ("broken" not in found) == absent, found
    fake_cupy.runtime = _FakeRuntime(count=1, query_status=999)
    found = _device.probe()
    assert found["count"] == 0 and "the device query raised" in found["broken"], found
    fake_cupy.runtime = _FakeRuntime(count=2)
    found = _device.probe()
    assert found["count"] == 2 and found["name"] == "Fake GPU" and "broken" not in found


def test_device_counts(fake_cupy):
    fake_cupy.runtime = _FakeRuntime(count=2)
    assert _gpu.no_device_reason(2) is None
    assert _gpu.no_device_reason(3).startswith(_gpu.NO_DEVICE)


def test_cpu_times_count_the_processes_a_test_waits_for(tmp_path):
    """tests/_cpu_times.py: a test's CPU seconds include a child process it ran (as an mpiexec
    launch's ranks), one line a test, summed per file at the end."""
    test = tmp_path / "test_probe.py"
    test.write_text("import subprocess, sys\n\n"
                    "def test_child():\n"
                    "    subprocess.run([sys.executable, '-c', 'import time\\n"
                    "t = time.process_time()\\nwhile time.process_time() - t < 0.5: pass'],"
                    " check=True)\n\n"
                    "def test_idle():\n    pass\n")
    records = tmp_path / "cpu.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                           "tests._cpu_times", "-p", "no:cacheprovider", str(test)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CC_TEST_CPU_TIMES": str(records)})
    assert proc.returncode == 0, proc.stdout
    lines = {r["test"].split("::")[-1]: r["cpu"]
             for r in map(json.loads, records.read_text().splitlines())}
    assert set(lines) == {"test_child", "test_idle"} and lines["test_child"] >= 0.5, lines
    assert lines["test_idle"] < 0.5 and "CPU time:" in proc.stdout and "2 tests" in proc.stdout


def test_a_batch_fails_the_job_that_raised_and_the_jobs_after_it():
    """One launch runs three workers: the first's output is its own, the second raises (no such
    script) and fails its request with the error, the third was never reached."""
    launch = Batch({"comm_worker.py": {2: ()}, "no_such_worker.py": {2: ()},
                    "dense_worker.py": {2: (5,)}}, timeout=60)
    assert launch.output("comm_worker.py", 2).count("comm ok") == 2
    with pytest.raises(pytest.fail.Exception, match="(?s)no_such_worker.py did not finish.*"
                       "No such file"):
        launch.output("no_such_worker.py", 2)
    with pytest.raises(pytest.fail.Exception, match="dense_worker.py 5 did not finish"):
        launch.output("dense_worker.py", 2)


def test_every_mutation_selection_names_tests_that_exist():
    """tests/mutation/run.py's test selections (every module's and the CI sample's) name test
    files and test ids pytest collects: a renamed test would otherwise fail a module's whole
    mutation run at its first step."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tests" / "mutation" /
                                                  "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    selections = list(run.MODULES.values()) + [run.SAMPLE["tests"]]
    ids = sorted({t for tests in selections for t in tests if not t.startswith("-")})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                           "-p", "no:cacheprovider", *ids], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_stray_paths_lists_what_a_run_must_not_leave(tmp_path):
    """The conftest's check of files left in the checkout: untracked and ignored paths count,
    bytecode, pytest's cache and an install's files do not; no git checkout: no check."""
    from tests.conftest import stray_paths

    assert stray_paths(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*.png\n__pycache__/\nbuild/\n")
    for name in ("pkg/m.py", "examples/plot.png", "notes.txt", "pkg/__pycache__/m.pyc",
                 "build/lib/x.py", ".pytest_cache/v", "pkg.egg-info/PKG-INFO", ".venv/bin/py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    subprocess.run(["git", "-C", str(tmp_path), "add", "pkg/m.py", ".gitignore"], check=True)
    assert stray_paths(tmp_path) == {"examples/", "notes.txt"}
