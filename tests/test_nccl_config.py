"""Non-blocking NCCL communicators through CuPy's binding (cupycoll/comm/_nccl_config.py),
checked against the installed ``nccl.h`` and the real CuPy classes (no device needed)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
from cupy.cuda import nccl

from cupycoll.comm import _nccl_config as config

_PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "nccl.h"
int main(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  printf("%zu %zu %zu %u %d %d\n", offsetof(ncclConfig_t, magic),
         offsetof(ncclConfig_t, version), offsetof(ncclConfig_t, blocking),
         (unsigned) NCCL_API_MAGIC, (int) NCCL_CONFIG_UNDEF_INT, c.blocking);
  return 0;
}
"""


def _header_dir() -> Path:
    import nvidia.nccl

    return Path(list(nvidia.nccl.__path__)[0]) / "include"


#: what nccl.h needs of the CUDA headers to compile as C (its CUDA includes are C++ headers;
#: ncclConfig_t's fields before ``blocking`` use none of their types).
_CUDA_STUBS = {"cuda_runtime.h": "typedef struct CUstream_st *cudaStream_t;\n"
                                 "typedef struct CUevent_st *cudaEvent_t;\n",
               "cuda_fp16.h": "", "cuda_bf16.h": "", "cuda_fp8.h": ""}


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """Offsets and constants of ncclConfig_t as the installed nccl.h defines them (compiled)."""
    folder = tmp_path_factory.mktemp("probe")
    for name, text in _CUDA_STUBS.items():
        (folder / name).write_text(text)
    (folder / "probe.c").write_text(_PROBE)
    subprocess.run(["gcc", "-I", str(_header_dir()), "-I", str(folder), "-o",
                    str(folder / "probe"), str(folder / "probe.c")], check=True,
                   capture_output=True, timeout=120)
    out = subprocess.run([str(folder / "probe")], check=True, capture_output=True, text=True)
    magic, version, blocking, api_magic, undef, initial = map(int, out.stdout.split())
    return {"blocking_after_magic": blocking - magic, "version_after_magic": version - magic,
            "api_magic": api_magic, "undef": undef, "initial": initial}


def test_the_structure_found_is_ncclconfig_as_the_header_lays_it_out(layout):
    assert layout["initial"] == layout["undef"] == -(2**31)
    assert layout["api_magic"] == 0xCAFEBEEF and layout["version_after_magic"] == 4
    cfg = nccl.NcclConfig(split_share=1)
    address = config._blocking_address(cfg)
    assert address is not None and config.blocking_of(cfg) == layout["undef"]
    magic = ctypes.c_uint.from_address(address - layout["blocking_after_magic"]).value
    assert magic == layout["api_magic"], hex(magic)


def test_nonblocking_config_sets_blocking_and_nothing_else(layout):
    cfg = config.nonblocking_config(nccl)
    assert cfg is not None and config.blocking_of(cfg) == 0
    fresh = nccl.NcclConfig()
    size = sys.getsizeof(cfg)
    before = ctypes.string_at(id(fresh), size)
    after = ctypes.string_at(id(cfg), size)
    at = config._blocking_address(cfg) - id(cfg)
    differ = [i for i in range(16, size) if before[i] != after[i]]  # past refcount and type
    assert differ and all(at <= i < at + 4 for i in differ), differ
    assert cfg.split_share == fresh.split_share


def test_no_config_where_cupy_cannot_make_one():
    class NoConfig:
        pass

    class Broken:
        @staticmethod
        def NcclConfig():
            raise RuntimeError("NcclConfig is not supported in this version")

    class Foreign:  # an object that holds no ncclConfig_t
        NcclConfig = staticmethod(lambda: object())

    assert config.nonblocking_config(NoConfig) is None
    assert config.nonblocking_config(Broken) is None
    assert config.nonblocking_config(Foreign) is None


def test_in_progress_is_what_cupy_raises_for_status_7():
    with pytest.raises(KeyError) as info:  # CuPy's NcclError has no text for ncclInProgress
        nccl.NcclError(config.IN_PROGRESS)
    assert config.in_progress(info.value)
    assert not config.in_progress(nccl.NcclError(4)) and not config.in_progress(KeyError(6))
    assert config.in_progress(type("Named", (Exception,), {"status": 7})())


def test_the_subclass_keeps_a_communicator_whose_init_is_in_progress():
    class Binding:  # CuPy's NcclCommunicator stores its comm, then check_status raises
        NcclError = nccl.NcclError

        class NcclCommunicator:
            def __init__(self, ndev, uid, rank, config):
                self.stored = (ndev, rank, config)
                raise nccl.NcclError(7 if rank == 0 else 4)

    kept = config.NonBlockingCommunicator(Binding)(2, b"", 0, "cfg")
    assert kept.stored == (2, 0, "cfg")
    with pytest.raises(nccl.NcclError):
        config.NonBlockingCommunicator(Binding)(2, b"", 1, "cfg")
    assert config.NonBlockingCommunicator(Binding) is config.NonBlockingCommunicator(Binding)
