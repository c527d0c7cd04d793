"""First-call kernel compile time: every instantiation up front vs lazily per instantiation.

    python bench/dev/bench_kernel_compile.py [--arch sm_80] [--json FILE]

NVRTC only (no GPU needed). Three figures, side by side in one run:

* ``all``: every instantiation of every kernel file, one NVRTC program per file with all its
  name expressions -- what the first use of the kernels cost before (``cupy.RawModule`` with
  ``name_expressions``, which CuPy < 14.1 also does not cache, so every run paid it again);
* ``first call``: only the instantiations a first ``sparse_allreduce`` (split, float32, sum) and
  a first Ok-Topk step actually launch, each compiled alone (``cupycoll._kernels.compiled``),
  into an empty cache -- what the first call costs now;
* ``cached``: the same instantiations again from the disk cache -- every later run.

The launched instantiations are recorded by running those calls on the sync-counting namespace
(the GPU code path with the kernels on the CPU), P = 1.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from cupycoll import _kernels


def launched() -> list[tuple[str, str]]:
    """(file, instantiation) launched by a first sparse_allreduce and a first Ok-Topk step."""
    import cupycoll as cc
    from cupycoll.testing.sync_counting import SyncCountingCommunicator, xp
    from cupycoll.topk import TopkState, topk_allreduce

    launcher = xp.cupycoll_primitives.launch  # builds the CPU kernels
    seen: list[tuple[str, str]] = []
    original = type(launcher).__call__

    def spy(self, file, expr, shape, *args):
        if (file, expr) not in seen:
            seen.append((file, expr))
        return original(self, file, expr, shape, *args)

    type(launcher).__call__ = spy
    try:
        comm = SyncCountingCommunicator()
        rng = np.random.default_rng(0)
        idx = xp.asarray(np.sort(rng.choice(1 << 12, 300, replace=False)).astype(np.int32))
        val = xp.asarray(rng.standard_normal(300).astype(np.float32))
        # a duplicate-carrying input also exercises the coalescing kernels
        cc.sparse_allreduce(xp.concatenate([idx, idx[:5]]), xp.concatenate([val, val[:5]]),
                            1 << 12, algorithm="split", comm=comm)
        x = xp.asarray(rng.standard_normal(1 << 12).astype(np.float32))
        topk_allreduce(x, 64, algorithm="oktopk", comm=comm, state=TopkState())
    finally:
        type(launcher).__call__ = original
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="sm_80")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    used = launched()
    total = sum(len(_kernels.name_expressions(f)) for f in _kernels.KERNEL_FILES)

    start = time.perf_counter()
    for file in _kernels.KERNEL_FILES:
        _kernels.nvrtc_compile(file, args.arch)
    t_all = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as cache:
        os.environ["CUPY_CACHE_DIR"] = cache
        start = time.perf_counter()
        for file, expr in used:
            _kernels.compiled(file, expr, args.arch)
        t_first = time.perf_counter() - start
        start = time.perf_counter()
        for file, expr in used:
            _kernels.compiled(file, expr, args.arch)
        t_cached = time.perf_counter() - start

    rows = [{"case": "all (before)", "instantiations": total, "seconds": round(t_all, 3),
             "ratio": 1.0},
            {"case": "first call (lazy)", "instantiations": len(used),
             "seconds": round(t_first, 3), "ratio": round(t_all / t_first, 1)},
            {"case": "later runs (cached)", "instantiations": len(used),
             "seconds": round(t_cached, 4), "ratio": round(t_all / max(t_cached, 1e-6))}]
    print(f"# NVRTC first-use compile time, {args.arch}; instantiations a first call launches:")
    for file, expr in used:
        print(f"#   {file}: {expr}")
    print(f"#{'case':>22}{'instantiations':>16}{'seconds':>10}{'before/this':>13}")
    for r in rows:
        print(f" {r['case']:>22}{r['instantiations']:>16}{r['seconds']:>10}{r['ratio']:>13}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": {"arch": args.arch}, "rows": rows, "launched": used}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
