"""Tier 1: every kernel file and every instantiation compiles for sm_80 and sm_90, without a GPU.

NVRTC is driven directly through ``cupy.cuda.nvrtc`` (no driver or device needed), with the
name expressions the loader uses. Each file also compiles standalone with the ``nvcc`` of the
``nvidia-cuda-nvcc`` wheel that the test extra installs (not whatever is on PATH; missing, the
test fails), and the cubin exports exactly the kernels NVRTC names, which checks the CC_EXPORT
lines against the name expressions.
"""

from __future__ import annotations

import functools
import struct
import subprocess
import time
from pathlib import Path

import pytest

from cupycoll import _kernels

ARCHS = ("sm_80", "sm_90")


def _wheel_nvcc() -> str:
    """The nvcc of the nvidia-cuda-nvcc wheel (part of the test extra); fail when it is absent."""
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for base in getattr(nvidia, "__path__", []):
        found = Path(base) / "cu13" / "bin" / "nvcc"
        if found.is_file():
            return str(found)
    pytest.fail("nvcc not found: the test extra installs it (pip install '.[test]' brings the "
                "nvidia-cuda-nvcc wheel)")


@functools.lru_cache(maxsize=None)
def _nvrtc(file: str, arch: str) -> tuple[dict[str, str], float]:
    try:
        from cupy.cuda import nvrtc  # noqa: F401
    except Exception as exc:  # the gpu extra is part of the test environment (see .ci/run)
        pytest.fail(f"tier-1 kernel checks need NVRTC through cupy (pip install '.[gpu-cu12]'): "
                    f"{exc}")
    start = time.perf_counter()
    lowered = _kernels.nvrtc_compile(file, arch)
    return lowered, time.perf_counter() - start


def _elf_global_functions(blob: bytes) -> set[str]:
    """Names of the global function symbols of a 64-bit little-endian ELF file (a cubin)."""
    assert blob[:4] == b"\x7fELF" and blob[4] == 2, "not an ELF64 file"
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", blob, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strings = sections[sec[6]][4]
        for off in range(sec[4], sec[4] + sec[5], sec[9]):
            name, info = struct.unpack_from("<IB", blob, off)
            if info == (1 << 4) | 2:  # STB_GLOBAL, STT_FUNC
                names.add(blob[strings + name:blob.index(b"\0", strings + name)].decode())
    return names


def test_every_kernel_file_is_listed():
    on_disk = {p.name for p in _kernels.kernel_dir().glob("*.cu")}
    assert on_disk == set(_kernels.KERNEL_FILES)


@pytest.mark.parametrize("file", _kernels.KERNEL_FILES)
def test_sources_are_self_contained(file):
    text = _kernels.source(file)
    assert "#include" not in text, "NVRTC gets no include path: headers must be local and inlined"
    assert _kernels.name_expressions(file), f"{file} exports no CC_EXPORT instantiation"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("file", _kernels.KERNEL_FILES)
def test_nvrtc_compiles_every_instantiation(file, arch):
    lowered, seconds = _nvrtc(file, arch)
    assert set(lowered) == set(_kernels.name_expressions(file))
    assert all(lowered.values())
    print(f"NVRTC {file} {arch}: {len(lowered)} kernels in {seconds:.1f} s")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("file", _kernels.KERNEL_FILES)
def test_nvcc_compiles_standalone(file, arch, tmp_path):
    folder = _kernels.kernel_dir()
    cubin = tmp_path / f"{file}.{arch}.cubin"
    cmd = [_wheel_nvcc(), "-std=c++17", "-cubin", f"-arch={arch}", f"-I{folder}", "-o", str(cubin),
           str(folder / file)]
    start = time.perf_counter()
    # wall clock on a loaded 2-core machine: segment.cu takes 4.6 s of CPU but 26-60 s of wall
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=folder.parent)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    assert "warning" not in proc.stderr, proc.stderr
    lowered, _ = _nvrtc(file, arch)
    assert _elf_global_functions(cubin.read_bytes()) == set(lowered.values())
    print(f"nvcc {file} {arch}: {seconds:.1f} s")


def test_instantiations_compile_alone_once_and_are_cached(tmp_path, monkeypatch):
    """The launcher's path: one instantiation per NVRTC program, cached on disk across runs."""
    whole_file = _nvrtc("select.cu", "sm_80")[0]  # fails with the reason if NVRTC is missing
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    expr = _kernels.expression("cc_rank_select", "float", "int")
    cubin, lowered = _kernels.compiled("select.cu", expr, "sm_80")
    assert cubin.parent == tmp_path / "cupycoll"
    blob = cubin.read_bytes()
    assert lowered == whole_file[expr] and lowered.encode() in blob
    others = [name for e, name in whole_file.items() if e != expr]
    assert not [name for name in others if name.encode() in blob]  # that one kernel only

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again although cached")

    monkeypatch.setattr(_kernels, "_nvrtc", no_compile)
    assert _kernels.compiled("select.cu", expr, "sm_80") == (cubin, lowered)
    with pytest.raises(AssertionError, match="compiled again"):
        _kernels.compiled("select.cu", expr, "sm_90")  # another architecture is another key


def test_ptx_fallback_compiles_through_nvrtc(tmp_path, monkeypatch):
    """A device newer than the installed NVRTC: PTX for the newest architecture NVRTC supports
    (the driver JIT-compiles it for the device), cached beside the cubin of the same kernel."""
    whole_file = _nvrtc("select.cu", "sm_80")[0]  # fails with the reason if NVRTC is missing
    newest = max(_kernels.supported_archs())
    target = _kernels.kernel_target(newest + 10, _kernels.supported_archs())
    assert target == f"compute_{newest}"
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    expr = _kernels.expression("cc_rank_select", "float", "int")
    ptx, lowered = _kernels.compiled("select.cu", expr, target)
    text = ptx.read_text()
    assert ptx.suffix == ".ptx" and f".target sm_{newest}\n" in text
    assert lowered == whole_file[expr] and f".entry {lowered}(" in text
    assert text.count(".entry ") == 1  # that one kernel only
