"""Mutation testing of cupycoll with mutmut, one module at a time, with the tests that matter.

Usage (from the repository root; needs the test extra, which installs mutmut):

    python tests/mutation/run.py                      # every module of MODULES
    python tests/mutation/run.py cupycoll/sparse/split.py cupycoll/primitives/_numpy_reduce.py
    python tests/mutation/run.py --sample             # CI-sized: SAMPLE only
    python tests/mutation/run.py --list               # modules and their test selections
    python tests/mutation/run.py --random 300 --seed 1 cupycoll/topk/gtopk.py ...
                                                      # a seeded uniform sample of the mutants

``--random N``: the score of N mutants drawn uniformly (seeded) from all mutants of the named
modules estimates theirs (killed / counted is a binomial proportion; the 95% Wilson interval is
printed). The modules are grouped by test selection, one folder ``build/mutation/random_<tests
hash>/`` per group mutating every module of MODULES with that selection (the stats phase, which
runs the selection once, is paid once per group, not per module). The names come from mutmut's
own generation, run alone (seconds, no tests); ``mutmut run NAME...`` then runs only the drawn
mutants. ``--exclude DIR`` (repeatable): leave out mutants already checked in an earlier build
folder (same name and same function hash, so the same mutant).

Each module runs in its own folder ``build/mutation/<module>/`` (a copy of cupycoll/, tests/,
kernels/ and a setup.cfg naming the module and its tests), so runs of different modules never
share state and a finished module keeps its results (mutmut resumes an interrupted run). mutmut
mutates one function at a time behind a trampoline and runs only the tests that called that
function; the tests' mpiexec workers report the functions they called back to mutmut
(``sitecustomize.py`` here and ``tests/conftest.py``), so mutants of multi-rank code are tested
by the multi-rank tests. Everything runs under ``nice``; ``--jobs`` bounds the parallel mutants.

Prints, per module, killed / survived / no tests / timeout and the score
killed / (killed + survived + no tests), and writes ``build/mutation/summary.json``. Surviving
mutants: ``cd build/mutation/<module> && mutmut results`` and ``mutmut show NAME``.

Not mutated (mutmut skips decorated functions): the ``@njit`` loops of ``primitives/_numba.py``
(a trampoline cannot run inside nopython code; their bit-equality tests cover them) and any
other decorated function (the registered top-k entry points).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "mutation"

# Multi-rank tests at 2-4 ranks that each cover every algorithm in one launch; the randomized
# launches (thousands of cases, minutes each) are left to the regular suite.
_SPARSE_MPI = "tests/test_sparse_mpi.py::"
_SPARSE = ["tests/test_sparse_units.py", "tests/test_api_units.py",
           "tests/test_sparse_in_process.py", "tests/test_sparse_front_door.py",
           "tests/test_sparse_dense_algorithm.py", "tests/test_sparse_validation.py",
           "tests/test_pipeline.py",
           "tests/test_tuner.py::test_choose_prices_a_shape_class_once_per_profile",
           *(_SPARSE_MPI + t for t in (
               "test_nan_inf_signed_zero_same_bits_in_every_algorithm[2]",
               "test_nan_inf_signed_zero_same_bits_in_every_algorithm[3]",
               "test_volume_equals_cost_models[2]", "test_volume_equals_cost_models[3]",
               "test_bad_input_raises_on_every_rank[3]", "test_delivery_alloc_completion_async[3]")),
           # wire_values on the sparse path (2 ranks, ~7 s)
           "tests/test_wire_mpi.py::test_wire_formats_exact_modelled_and_mass_conserving[2]",
           # calls finished by the validation allreduce (sparse/small.py)
           "tests/test_sparse_small.py::test_slots_are_bounded",
           "tests/test_sparse_small.py::test_fits_and_cost_model",
           *(f"tests/test_sparse_small.py::test_small_calls_against_numpy[{p}]"
             for p in (1, 2, 3)),
           "tests/test_sparse_small.py::test_small_calls_on_emulated_nccl[2]"]
# The in-process unit tests, then one short launch at 2 and at 3 ranks that reaches every
# function of cupycoll/topk/ (tests/workers/topk_quick.py: the regular workers' checks on tiny
# inputs, ~5-10 s), and the density workload at 2 ranks (run only for mutants the others miss:
# mutmut runs the fastest tests first and stops at the first failure). The regular top-k MPI
# launches (5-10 s each at 2-3 ranks, up to minutes at 5-8) are left to the regular suite.
_TOPK = ["tests/test_topk_units.py", "tests/test_topk_selectors.py",
         "tests/test_topk_front_door.py", "tests/test_topk_packed_transfers.py",
         "tests/test_topk_tiny_inputs.py::test_topk_quick_every_algorithm[2]",
         "tests/test_topk_tiny_inputs.py::test_topk_quick_every_algorithm[3]",
         "tests/test_topk_mpi.py::test_topk_density_under_error_feedback[2]"]
# The primitives' tests minus the large-array cases (13-116 s each under load, ~300 of the
# ~370 s of the selection); tests/test_primitives_small_paths.py reaches their paths with small
# arrays and lowered thresholds (the blocked numpy merge, the sampled top-k threshold).
_PRIM_SLOW = ["tests/test_numba_accel.py::test_merge_sorted_matches_numpy",
              "tests/test_kernels_cpu.py::test_hot_index_block_sizes",
              "tests/test_primitives.py::test_merge_sorted_identical_parts_rows",
              *(f"tests/test_primitives.py::test_blocked_merge_and_coo_reduce_large[{p}]"
                for p in ("int32-2143289344", "int64-1099511627776")),
              *(f"tests/test_primitives.py::test_large_arrays_select_and_topk[{d}]"
                for d in ("float32", "float64", "int32", "int64"))]
_PRIMITIVES = ["tests/test_primitives.py", "tests/test_primitives_small_paths.py",
               "tests/test_numba_accel.py", "tests/test_kernels_cpu.py",
               "tests/test_sparse_units.py", *(f"--deselect={t}" for t in _PRIM_SLOW)]

#: module -> the tests mutmut may choose from (it runs those that call the mutated function).
MODULES = {
    **{f"cupycoll/sparse/{m}.py": _SPARSE for m in (
        "_common", "_cost", "_validate", "allgather", "api", "auto", "dense", "mask",
        "recursive_doubling", "small", "split")},
    **{f"cupycoll/topk/{m}.py": _TOPK for m in (
        "_common", "_global_threshold", "_oktopk_phases", "_oktopk_small", "_wire", "api",
        "compressor", "dense", "gaussiank", "gtopk", "oktopk", "selectors", "topka")},
    **{m: _SPARSE + ["tests/test_hierarchical.py::test_exact_on_emulated_nodes[4-20]",
                     "tests/test_hierarchical.py::test_exact_on_emulated_nodes[5-15]"]
       for m in ("cupycoll/sparse/hierarchical.py", "cupycoll/comm/_group.py",
                 "cupycoll/comm/_topology.py")},
    **{f"cupycoll/primitives/{m}.py": _PRIMITIVES for m in (
        "__init__", "_accel", "_checks", "_common", "_numpy_few", "_numpy_reduce",
        "_numpy_select")},
    "cupycoll/primitives/_numba.py": _PRIMITIVES,
    "cupycoll/primitives/_cupy.py": ["tests/test_kernels_cpu.py",
                                     "--deselect=tests/test_kernels_cpu.py::"
                                     "test_hot_index_block_sizes"],
    **{f"cupycoll/comm/{m}.py": ["tests/test_api_units.py", "tests/test_sparse_units.py",
                                 "tests/test_comm_base_defaults.py",
                                 "tests/test_comm_derived_verbs.py",
                                 "tests/test_dense.py::test_dense_collectives_match_numpy[3]",
                                 "tests/test_dense.py::test_comm_stats_errors_timeouts[3]",
                                 _SPARSE_MPI + "test_volume_equals_cost_models[3]"]
       for m in ("_base", "_stats", "_work")},
    # the stream the pipeline enters shows on emulated NCCL only: the discipline workers
    "cupycoll/_pipeline.py": _SPARSE + _TOPK[:3] + ["tests/test_gpu_discipline.py"],
    # the dense front doors: in process, one launch of the workers at 3 ranks, CUPYCOLL_DEBUG
    "cupycoll/collectives.py": ["tests/test_dense_front_door.py", "tests/test_api_units.py",
                                "tests/test_pipeline.py",
                                "tests/test_dense.py::test_dense_collectives_match_numpy[3]",
                                "tests/test_dense.py::test_comm_stats_errors_timeouts[3]",
                                "tests/test_dense.py::"
                                "test_debug_mode_catches_mismatched_calls_on_every_rank[3]",
                                "tests/test_gpu_discipline.py"],
}
#: CI-sized sample: split's two pure region functions (~100 mutants) against the in-process
#: unit tests only, in its own folder (``build/mutation/sample_...``).
SAMPLE = {"module": "cupycoll/sparse/split.py", "tests": ["tests/test_sparse_units.py"],
          "mutants": ["cupycoll.sparse.split.x_local_samples*",
                      "cupycoll.sparse.split.x_region_bounds*"]}


def _work(module: str, sample: bool = False) -> Path:
    return BUILD / (("sample_" if sample else "") + module.replace("/", "_").removesuffix(".py"))


def _setup(work: Path, module: str, tests: list[str]) -> Path:
    """A fresh work folder for ``module`` (kept as is when it exists: mutmut resumes)."""
    if (work / "mutants").exists():
        return work
    work.mkdir(parents=True, exist_ok=True)
    for name in ("cupycoll", "tests", "kernels"):
        shutil.rmtree(work / name, ignore_errors=True)
        shutil.copytree(ROOT / name, work / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    (work / "setup.cfg").write_text(
        "[mutmut]\nsource_paths = cupycoll\n"
        f"only_mutate = {module}\n"
        "also_copy =\n    kernels\n"
        "pytest_add_cli_args_test_selection =\n" + "".join(f"    {t}\n" for t in tests) +
        # -n 0: the tests in mutmut's own process (pyproject's addopts run two xdist workers)
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -n\n    0\n"
        "timeout_multiplier = 3.0\ntimeout_constant = 60.0\n")
    return work


def _env(work: Path) -> dict[str, str]:
    hits = work / "hits"
    hits.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["CC_MUTMUT_HITS"] = str(hits)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env.setdefault("CUPYCOLL_THREADS", "1")
    return env


def _mutmut() -> list[str]:
    return [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())"]


def run_module(module: str, jobs: int, sample: bool = False) -> dict:
    work = _setup(_work(module, sample), module, SAMPLE["tests"] if sample else MODULES[module])
    env = _env(work)
    start = time.perf_counter()
    names = SAMPLE["mutants"] if sample else []
    proc = subprocess.run(["nice", "-n", "10", *_mutmut(), "run", "--max-children", str(jobs),
                           *names],
                          cwd=work, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (work / "run.log").write_text(proc.stdout + proc.stderr)
    subprocess.run([*_mutmut(), "export-cicd-stats"], cwd=work, env=env, capture_output=True)
    stats_file = work / "mutants" / "mutmut-cicd-stats.json"
    if proc.returncode != 0 or not stats_file.exists():
        return {"module": module, "error": f"mutmut exit {proc.returncode}, see {work}/run.log",
                "seconds": round(seconds)}
    stats = json.loads(stats_file.read_text())
    if sample:  # the stats count every mutant of the module; count the sample's only
        stats = _sample_stats(work)
    counted = stats["killed"] + stats["survived"] + stats["no_tests"]
    survivors = subprocess.run([*_mutmut(), "results"], cwd=work, env=env, capture_output=True,
                               text=True).stdout.split("\n")
    return {"module": module, "seconds": round(seconds), **stats,
            "score": round(stats["killed"] / counted, 4) if counted else None,
            "not_killed": [s.strip() for s in survivors if s.strip()
                           and not (sample and "not checked" in s)]}


def _sample_stats(work: Path) -> dict:
    """killed / survived / no_tests / timeout of the SAMPLE mutants, from mutmut's meta file."""
    import fnmatch

    meta = json.loads((work / "mutants" / (SAMPLE["module"] + ".meta")).read_text())
    codes = [c for name, c in meta["exit_code_by_key"].items()
             if any(fnmatch.fnmatch(name, pat) for pat in SAMPLE["mutants"])]
    return {"killed": sum(c in (1, 3) for c in codes), "survived": codes.count(0),
            "no_tests": sum(c in (5, 33) for c in codes),
            "timeout": sum(c in (24, -24, 36, 152, 255) for c in codes), "total": len(codes)}


def _group_work(tests: list[str]) -> Path:
    import hashlib

    return BUILD / ("random_" + hashlib.sha1("\n".join(tests).encode()).hexdigest()[:8])


def _setup_group(tests: list[str]) -> Path:
    """A folder mutating every module of MODULES whose test selection is ``tests``."""
    work = _group_work(tests)
    _setup(work, "\n    ".join([""] + [m for m, t in MODULES.items() if t == tests]), tests)
    return work


_GENERATE = ("from mutmut.__main__ import (copy_src_dir, copy_also_copy_files, "
             "setup_source_paths, create_mutants, set_mutant_under_test)\n"
             "set_mutant_under_test('mutant_generation'); copy_src_dir(); copy_also_copy_files();"
             " setup_source_paths(); create_mutants(1)")


def _metas(folder: Path) -> dict[str, dict]:
    """module path -> mutmut's meta data (exit code by mutant name, hash by function)."""
    return {str(f.relative_to(folder / "mutants")).removesuffix(".meta"): json.loads(f.read_text())
            for f in (folder / "mutants").rglob("*.py.meta")}


def _checked(folders: list[str]) -> set[tuple[str, str]]:
    """(mutant name, function hash) of every mutant with a result in the given build folders."""
    done = set()
    for folder in folders:
        for meta in _metas(Path(folder)).values():
            hashes = meta.get("hash_by_function_name", {})
            for name, code in meta["exit_code_by_key"].items():
                if code is not None:
                    done.add((name, hashes.get(_function(name))))
    return done


def _function(name: str) -> str:
    return name.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def run_random(modules: list[str], count: int, seed: int, jobs: int,
               exclude: list[str], dry: bool = False) -> dict:
    """Draw ``count`` mutants uniformly from ``modules``, run them, count them per module."""
    import random

    from mutmut.stats import status_by_exit_code

    groups: dict[tuple, list[str]] = {}
    for m in modules:
        groups.setdefault(tuple(MODULES[m]), []).append(m)
    done = _checked(exclude)
    population = []  # (module, name, work folder)
    for tests in groups:
        work = _setup_group(list(tests))
        subprocess.run([sys.executable, "-c", _GENERATE], cwd=work, env=_env(work), check=True,
                       capture_output=True)
        for path, meta in _metas(work).items():
            if path in groups[tests]:
                hashes = meta["hash_by_function_name"]
                population += [(path, name, work) for name in sorted(meta["exit_code_by_key"])
                               if (name, hashes.get(_function(name))) not in done]
    random.Random(seed).shuffle(population)  # a larger count draws a superset of a smaller one
    drawn = sorted(population[:count])
    by_work: dict[Path, list[str]] = {}
    for _, name, work in drawn:
        by_work.setdefault(work, []).append(name)
    if dry:
        return {"population": {m: sum(p[0] == m for p in population) for m in modules},
                "drawn": {str(w): names for w, names in by_work.items()}}
    seconds, errors = {}, []
    for work, names in by_work.items():
        checked = {n for meta in _metas(work).values()
                   for n, code in meta["exit_code_by_key"].items() if code is not None}
        names = [n for n in names if n not in checked]  # mutmut reruns the names it is given
        if not names:
            continue
        start = time.perf_counter()
        proc = subprocess.run(["nice", "-n", "15", *_mutmut(), "run", "--max-children",
                               str(jobs), *names], cwd=work, env=_env(work),
                              capture_output=True, text=True)
        seconds[work.name] = round(time.perf_counter() - start)
        (work / "run.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:  # the folder's mutants stay unchecked: not counted below
            errors.append(f"mutmut exit {proc.returncode}, see {work}/run.log")
    codes = {name: meta["exit_code_by_key"].get(name)
             for work in by_work for meta in _metas(work).values()
             for name in meta["exit_code_by_key"]}
    rows: dict[str, dict] = {}
    for module, name, _ in drawn:
        row = rows.setdefault(module, {"population": sum(p[0] == module for p in population),
                                       "drawn": 0, "killed": 0, "survived": 0, "no tests": 0,
                                       "timeout": 0, "other": 0, "not_killed": []})
        status = status_by_exit_code[codes.get(name)]
        if status == "not checked":
            continue
        row["drawn"] += 1
        row[status if status in row else "other"] += 1
        if status != "killed":
            row["not_killed"].append(f"{name}: {status}")
    total = {key: sum(r[key] for r in rows.values())
             for key in ("drawn", "killed", "survived", "no tests", "timeout", "other")}
    total["population"] = len(population)
    for row in [*rows.values(), total]:
        counted = row["killed"] + row["survived"] + row["no tests"]
        row["score"] = round(row["killed"] / counted, 4) if counted else None
        row["wilson95"] = [round(x, 4) for x in wilson(row["killed"], counted)]
    return {"seed": seed, "count": count, "modules": modules, "seconds": seconds,
            "errors": errors, "by_module": rows, "total": total}


def _print_random(result: dict) -> None:
    print("module | mutants | drawn | killed | survived | no tests | timeout | score | 95% CI")
    for module, r in [*result["by_module"].items(), ("total", result["total"])]:
        print(f"{module} | {r['population']} | {r['drawn']} | {r['killed']} | {r['survived']} | "
              f"{r['no tests']} | {r['timeout']} | {r['score']} | "
              f"{r['wilson95'][0]:.3f}-{r['wilson95'][1]:.3f}")
    print(f"(drawn: the checked mutants of the {result['count']} drawn)")
    for r in result["by_module"].values():
        for line in r["not_killed"]:
            print("  not killed:", line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules (default: all of MODULES)")
    parser.add_argument("--sample", action="store_true", help="only the CI sample")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run in parallel")
    parser.add_argument("--list", action="store_true", help="print modules and tests, exit")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--random", type=int, metavar="N",
                        help="run N mutants drawn uniformly from the modules' mutants")
    parser.add_argument("--seed", type=int, default=1, help="seed of the --random draw")
    parser.add_argument("--exclude", action="append", default=[], metavar="DIR",
                        help="--random: skip mutants checked in this build folder (repeatable)")
    parser.add_argument("--min-score", type=float, default=0.0,
                        help="exit 1 if a module scores below this (0..1)")
    args = parser.parse_args(argv)
    modules = [SAMPLE["module"]] if args.sample else args.modules or list(MODULES)
    if args.list and not args.random:
        for m in modules:
            tests = SAMPLE["tests"] if args.sample else MODULES[m]
            print(f"{m}: {' '.join(tests)}" + (f" (mutants {SAMPLE['mutants']})"
                                                  if args.sample else ""))
        return 0
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {sorted(MODULES)}")
    summary_file = BUILD / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    if args.random:
        result = run_random(modules, args.random, args.seed, args.jobs, args.exclude, args.list)
        if args.list:  # the draw only: population per module and the drawn names
            print(json.dumps(result, indent=1))
            return 0
        summary[f"random {args.random} seed {args.seed}: {' '.join(modules)}"] = result
        BUILD.mkdir(parents=True, exist_ok=True)
        summary_file.write_text(json.dumps(summary, indent=1))
        _print_random(result)
        if result["errors"]:
            print("\n".join(result["errors"]))
            return 1
        return 1 if (result["total"]["score"] or 0) < args.min_score else 0
    failed = False
    for module in modules:
        if args.fresh:
            shutil.rmtree(_work(module, args.sample), ignore_errors=True)
        result = run_module(module, args.jobs, args.sample)
        summary[("sample " if args.sample else "") + module] = result
        BUILD.mkdir(parents=True, exist_ok=True)
        summary_file.write_text(json.dumps(summary, indent=1))
        if "error" in result:
            print(f"{module}: {result['error']}")
            failed = True
            continue
        print(f"{module}: killed {result['killed']} survived {result['survived']} no tests "
              f"{result['no_tests']} timeout {result['timeout']} score {result['score']} "
              f"({result['seconds']} s)", flush=True)
        failed |= result["score"] is not None and result["score"] < args.min_score
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
