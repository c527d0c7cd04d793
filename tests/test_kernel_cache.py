"""The kernel cache's files and the choice of what to compile for a device (no GPU needed).

Writers of one cache key at once (threads of one process share a PID, as processes of two
hosts sharing a home directory may) must never tear a file, take each other's temporary file or
leave one behind; the target is a cubin for the device's architecture when NVRTC supports it,
else PTX for the newest supported architecture below it; the launcher loads what was chosen.
NVRTC itself is replaced by fakes here: tests/test_kernels_compile.py compiles for real.
"""

from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

import pytest

from cupycoll import _kernels
from cupycoll.errors import BackendUnavailable

EXPR = _kernels.expression("cc_rank_select", "float", "int")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, and NVRTC replaced by a fake returning the calling thread's bytes
    (1 MiB of its name's first letter), so a torn file shows mixed letters."""
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))

    def fake_nvrtc(name, exprs, arch, cubin):
        letter = threading.current_thread().name[0].encode()
        return letter * (1 << 20), {e: f"lowered_{letter.decode()}" for e in exprs}

    monkeypatch.setattr(_kernels, "_nvrtc", fake_nvrtc)
    return tmp_path / "cupycoll"


def test_concurrent_writers_of_one_key_never_collide(cache, monkeypatch):
    """Both writers reach every rename together (a barrier in os.replace): with one temporary
    name per PID the second rename finds its file taken by the first."""
    barrier, real_replace = threading.Barrier(2), os.replace

    def replace_together(src, dst):
        try:
            barrier.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass  # the other writer failed: go on alone
        real_replace(src, dst)

    monkeypatch.setattr(_kernels.os, "replace", replace_together)
    results, errors = {}, []

    def write():
        try:
            results[threading.current_thread().name] = _kernels.compiled("select.cu", EXPR,
                                                                         "sm_80")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, name=name) for name in ("A-writer", "B-writer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    paths = {path for path, _ in results.values()}
    assert len(results) == 2 and len(paths) == 1
    path = paths.pop()
    blob = path.read_bytes()
    assert len(blob) == 1 << 20 and blob in (b"A" * (1 << 20), b"B" * (1 << 20)), "torn cubin"
    assert (cache / path.with_suffix(".name").name).read_text() in ("lowered_A", "lowered_B")
    assert sorted(p.suffix for p in cache.iterdir()) == [".cubin", ".name", ".source"]


def test_a_failed_write_leaves_no_temporary_file(cache, monkeypatch):
    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_kernels.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        _kernels.compiled("select.cu", EXPR, "sm_80")
    assert list(cache.iterdir()) == []


def test_ptx_is_cached_under_its_own_key(cache):
    cubin, _ = _kernels.compiled("select.cu", EXPR, "sm_90")
    ptx, _ = _kernels.compiled("select.cu", EXPR, "compute_90")
    assert cubin.suffix == ".cubin" and ptx.suffix == ".ptx" and cubin.stem != ptx.stem
    assert ptx.with_suffix(".source").read_text() == f"select.cu\n{EXPR}"  # for the emulator


@pytest.mark.parametrize("capability, supported, target", [
    (90, (75, 80, 86, 89, 90, 100, 120), "sm_90"),            # supported: a cubin
    (90, (120, 90, 80, 90), "sm_90"),                          # any order, duplicates
    (100, (75, 80, 86, 89, 90), "compute_90"),                 # newer than every one: PTX
    (130, (75, 80, 90, 100, 120, 121), "compute_121"),
    (110, (80, 90, 100, 101, 103, 120, 121), "compute_103"),   # between two: the older one
    (75, (75,), "sm_75"),
])
def test_kernel_target(capability, supported, target):
    assert _kernels.kernel_target(capability, supported) == target


@pytest.mark.parametrize("supported", [(75, 80, 90), ()])
def test_kernel_target_of_a_device_older_than_nvrtc_raises(supported):
    """PTX of compute_YY runs only on capability >= YY: nothing this NVRTC makes runs there."""
    with pytest.raises(BackendUnavailable, match="sm_70"):
        _kernels.kernel_target(70, supported)


def test_ptx_fallback_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(_kernels, "supported_archs", lambda: (80, 90))
    _kernels.device_target.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="cupycoll"):
            assert _kernels.device_target(90) == "sm_90"
            assert [_kernels.device_target(120) for _ in range(3)] == ["compute_90"] * 3
    finally:
        _kernels.device_target.cache_clear()
    records = [r for r in caplog.records if "PTX" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert "sm_120" in records[0].getMessage() and "compute_90" in records[0].getMessage()


def test_launcher_loads_the_ptx_of_a_device_newer_than_nvrtc(monkeypatch):
    """A fake CuPy whose device is sm_120 under an NVRTC that stops at sm_90: the launcher
    compiles for compute_90 and loads that file through RawModule(path=...)."""
    compiled_for, loaded, launched = [], [], []

    def fake_compiled(file, expr, arch):
        compiled_for.append(arch)
        return f"/cache/{arch}.ptx", "lowered"

    class FakeModule:
        def __init__(self, path):
            loaded.append(path)

        def get_function(self, name):
            return lambda grid, block, args: launched.append((name, grid, block))

    fake_cupy = SimpleNamespace(
        RawModule=FakeModule,
        cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: 0),
                             Device=lambda d: SimpleNamespace(compute_capability="120")))
    monkeypatch.setattr(_kernels, "compiled", fake_compiled)
    monkeypatch.setattr(_kernels, "supported_archs", lambda: (75, 80, 90))
    monkeypatch.setattr(_kernels.CupyLauncher, "xp", property(lambda self: fake_cupy))
    _kernels.device_target.cache_clear()
    try:
        launcher = _kernels.CupyLauncher()
        launcher("select.cu", EXPR, (4, 256), None)
        launcher("select.cu", EXPR, (4, 256), None)
    finally:
        _kernels.device_target.cache_clear()
    assert compiled_for == ["compute_90"] and loaded == ["/cache/compute_90.ptx"]
    assert launched == [("lowered", (4,), (256,))] * 2


@pytest.mark.parametrize("where", ["file", "missing parent"])
def test_an_emulation_cache_that_cannot_be_a_folder_names_the_variable(where, tmp_path,
                                                                        monkeypatch):
    """CUPYCOLL_EMULATION_CACHE naming a file (or a path under one): InvalidArgument naming
    the variable, not the OSError of mkdir."""
    from cupycoll.errors import InvalidArgument
    from cupycoll.testing.kernel_shim import cache_dir

    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("CUPYCOLL_EMULATION_CACHE",
                       str(afile if where == "file" else afile / "below"))
    with pytest.raises(InvalidArgument, match="'CUPYCOLL_EMULATION_CACHE'.*cannot be made a "
                       "folder"):
        cache_dir()


def test_a_kernel_g_plus_plus_warns_on_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A source g++ warns on raises RuntimeError naming it, and its partial build goes: the
    cache holds no ``*.tmp`` (each try would add one)."""
    from cupycoll.testing import kernel_shim

    if kernel_shim.compiler() is None:
        pytest.fail("the kernel tests need a C++17 compiler (g++) on PATH")
    monkeypatch.setenv("CUPYCOLL_EMULATION_CACHE", str(tmp_path))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="g\\+\\+ failed or warned"):
            kernel_shim.library("__global__ void k(int* p) { int unused; p[0] = 1; }\n")
    assert not list(tmp_path.rglob("*.tmp")), list(tmp_path.rglob("*"))
