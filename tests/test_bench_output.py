"""Benchmark plumbing (bench/_common.py): sizes, statistics, JSON/CSV/plot output and footers."""

import argparse
import csv
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _common  # noqa: E402


@pytest.mark.parametrize("text,value", [("8", 8), ("1e6", 1_000_000), ("64K", 65536),
                                        ("16M", 16 << 20), ("16MB", 16 << 20),
                                        ("16MiB", 16 << 20), ("16mib", 16 << 20),
                                        ("2G", 2 << 30), ("0.5K", 512), (" 1T ", 1 << 40),
                                        ("4611686018427387903", 2**62 - 1)])
def test_parse_size_accepts(text, value):
    assert _common.parse_size(text) == value


@pytest.mark.parametrize("text", ["16Q", "", "M", "-1", "1.5", "16 MB B", "0x10", "1e-3",
                                  "1e30", "4611686018427387904", "5000000T"])
def test_parse_size_rejects_clearly(text):
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        _common.parse_size(text)


def test_sample_stats_against_numpy():
    samples = np.array([3.0, 1.0, 2.0, 10.0]) * 1e-6
    stats = _common.sample_stats(samples)
    assert stats["median(us)"] == pytest.approx(2.5) and stats["min(us)"] == pytest.approx(1)
    assert stats["p95(us)"] == pytest.approx(np.percentile([3, 1, 2, 10], 95))
    assert stats["stdev(us)"] == pytest.approx(np.std([3, 1, 2, 10], ddof=1))
    assert stats["iters"] == 4


def test_table_writes_everything_and_footers(tmp_path, capsys):
    table = _common.Table(["size(B)", "time(us)", "busbw(GB/s)", "#wrong"], rank=0)
    table.header("demo")
    for size, wrong in ((8, 0), (64, 2)):
        table.add({"size(B)": size, "time(us)": 1.5 * size, "busbw(GB/s)": 0.5, "#wrong": wrong,
                   "collective": "allreduce"})
    args = argparse.Namespace(json=str(tmp_path / "r.json"), csv=str(tmp_path / "r.csv"),
                              plot=str(tmp_path / "r.png"))
    status = table.finish(args, {"ranks": 2}, plot=("size(B)", "time(us)", "collective"))
    assert status == 1  # a wrong value fails the run
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "# Out of bounds values : 2 FAILED"
    assert out[-1] == "# Avg bus bandwidth    : 0.5"
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["meta"]["ranks"] == 2 and "numpy" in doc["meta"]["versions"]
    assert doc["meta"]["arguments"]["csv"] == args.csv and len(doc["rows"]) == 2
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["size(B)"] for r in rows] == ["8", "64"] and rows[1]["#wrong"] == "2"
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_only_rank_zero_prints_and_writes(tmp_path, capsys):
    table = _common.Table(["size(B)"], rank=1)
    table.header("x")
    table.add({"size(B)": 1})
    args = argparse.Namespace(json=str(tmp_path / "r.json"), csv=None, plot=None)
    assert table.finish(args) == 0
    assert capsys.readouterr().out == "" and not (tmp_path / "r.json").exists()


def test_progress_is_silent_off_a_terminal(capsys):
    assert list(_common.progress(range(5), 5, rank=0)) == list(range(5))
    assert capsys.readouterr().err == ""  # pytest's stderr is not a terminal


def test_regret_table_when_auto_picks_an_algorithm_not_run(capsys):
    """bench_sparse's regret table: a pick outside --algorithms shows "-" and is not counted."""
    pytest.importorskip("mpi4py")
    import bench_sparse
    row = {"ranks": 4, "n": 1 << 20, "width": 0, "density": 0.01, "overlap": "random",
           "skew": 0.0, "best": "dense", "auto_choice": "split", "pick_x_best": None,
           "auto_x_best": 1.05, "auto_x_dense": 1.2, "best_x_dense": 1.1, "pred_over_meas": [],
           "result_x_dense": 0.4}
    ran = dict(row, auto_choice="dense", pick_x_best=1.0, auto_x_dense=1.1,
               pred_over_meas=[0.9, 1.1], result_x_dense=1.5)
    bench_sparse.print_regret([row, ran])
    out = capsys.readouterr().out
    assert "| split | - | 1.05 |" in out and "| dense | 1.00 | 1.05 |" in out
    assert "| 1.20 | 1.10 | 0.40 |" in out and "| 1.10 | 1.10 | 1.50 |" in out
    assert "<= 1.10x best on 1/1 rows where it ran" in out
    assert ("auto <= 1.15x dense Allreduce on 0/1 rows whose sparse result is smaller than the "
            "dense vector (1/2 in all)") in out and "within +-30% on 2/2" in out


@pytest.mark.parametrize("flags,rows", [([], 20), (["--cold", "--no-nccl"], 13)])
def test_bench_host_prints_every_row(flags, rows):
    """bench/dev/bench_host.py, hot (10th percentiles, the NCCL backend's rows over its null
    NCCL too) and --cold (interleaved medians), one process."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "dev" / "bench_host.py"),
                          "-n", "20", *flags], capture_output=True, text=True,
                         timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    table = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert len(table) == rows and all(float(r[-1]) > 0 for r in table), out
    assert ("cold caches" in out) == ("--cold" in flags)
    assert ("nccl" in out) == ("--no-nccl" not in flags)


def test_bench_waits_prints_every_policy_for_each_duration():
    """bench/dev/bench_waits.py: the NCCL backend's wait, the same with fixed naps and the
    former sleeping one, side by side, one row per duration of device work: the lateness and
    the CPU time of each (figures only in docs/gpu.md, never asserted here)."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "dev" / "bench_waits.py"),
                          "-n", "5", "--durations", "5e-6,2e-4"], capture_output=True, text=True,
                         timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert [r[0] for r in rows] == ["5", "200"] and all(len(r) == 7 for r in rows), out
    assert all(float(v) > 0 for r in rows for v in r[1:]), out


def test_bench_layers_prints_each_layer_of_each_verb_and_size():
    """bench/dev/bench_layers.py, one process: six layers per verb and size, times > 0."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "dev" / "bench_layers.py"),
                          "-n", "5", "-w", "1", "--sizes", "8,4K"], capture_output=True, text=True,
                         timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    blocks = out.split("# layer")[1:]
    assert len(blocks) == 4 and out.count("ranks=1") == 4, out
    for block in blocks:
        rows = [line.split() for line in block.splitlines()[1:] if line.strip()]
        rows = [r for r in rows if not r[0].startswith("#")]
        assert len(rows) == 6 and all(float(r[-2]) > 0 for r in rows), block
    bad = subprocess.run([sys.executable, str(root / "bench" / "dev" / "bench_layers.py"),
                          "--verbs", "broadcast", "-n", "1"], capture_output=True, text=True,
                         timeout=300, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert bad.returncode == 2 and "'broadcast'" in bad.stderr, bad.stderr  # it times no other


@pytest.mark.parametrize("flags", [[], ["--block", "3"]])
def test_bench_small_prints_its_raw_bounds_and_calls(flags):
    """bench_small.py, one process: the allgather baseline, the validation round's raw MAX
    allreduce, a dense Allreduce of the same n, and the three cupycoll calls."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "bench_small.py"), "-n", "5",
                          "-w", "1", "--length", "700", *flags], capture_output=True,
                         text=True, timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(rows) == 6 and all(float(r.split()[-2]) > 0 for r in rows), out
    assert "(validation)" in out and "MPI Allreduce of n=700 float32" in out


def test_bench_small_blocks_warm_up_at_least_w_calls():
    """bench_small.py --block B -w W: whole warm-up blocks of at least W calls each (none for
    W = 0), then a block per round."""
    pytest.importorskip("mpi4py")
    import bench_small

    made = []
    comm = SimpleNamespace(size=1, barrier=lambda: None)
    for warmup, blocks in ((0, 0), (1, 1), (3, 1), (4, 2)):
        made.clear()
        bench_small.blocked({"call": lambda: made.append(1)}, 2, 3, warmup, comm)
        assert len(made) == 3 * (blocks + 2), warmup


def test_regret_counts_for_other_profiles(capsys):
    """``--profiles``: each other profile's pick and predictions counted on the same rows."""
    pytest.importorskip("mpi4py")
    import bench_sparse
    row = {"ranks": 2, "n": 1 << 14, "width": 0, "density": 0.01, "overlap": "random",
           "skew": 0.0, "best": "dense", "auto_choice": "dense", "pick_x_best": 1.0,
           "auto_x_best": 1.0, "auto_x_dense": 4.0, "best_x_dense": 4.0,
           "pred_over_meas": [0.9, 1.1], "result_x_dense": 0.02,
           "profiles": {"a.json": {"pick_x_best": 1.3, "pred_over_meas": [0.5, 0.8, 1.2]},
                        "b.json": {"pick_x_best": 1.05, "pred_over_meas": [1.4]}}}
    bench_sparse.print_regret([row, dict(row, profiles={
        "a.json": {"pick_x_best": 1.0, "pred_over_meas": [1.0]},
        "b.json": {"pick_x_best": None, "pred_over_meas": [0.2]}})])
    out = capsys.readouterr().out
    assert "# with a.json: its pick <= 1.10x best on 1/2 rows; predictions within +-30% on 3/4" \
        in out
    assert "# with b.json: its pick <= 1.10x best on 1/1 rows; predictions within +-30% on 0/2" \
        in out


@pytest.mark.parametrize("flags,taken", [("befnwcdo", "-b -e -f -n -w -c -d -o"),
                                         ("nwc", "-n -w -c"), ("", "")])
def test_a_benchmark_refuses_the_nccl_tests_flags_it_does_not_honour(flags, taken, capsys):
    """A flag a benchmark would ignore (bench_sparse's -d, bench_regret's -n) is a usage error,
    not a run of other sizes or types than asked."""
    parser = _common.common_parser("x", flags=flags)
    for letter in "befnwcdo":
        value = "1" if letter == "c" else "2" if letter in "nwf" else "8" if letter in "be" \
            else "float64"
        if f"-{letter}" in taken:
            assert parser.parse_args([f"-{letter}", value]) is not None
        else:
            with pytest.raises(SystemExit):
                parser.parse_args([f"-{letter}", value])
            assert "unrecognized arguments" in capsys.readouterr().err
    if "-o" in taken:
        assert parser.parse_args(["-o", "max"]).op == "max"


def test_bench_regret_runs_a_loop_shorter_than_its_late_window():
    """bench_regret.py, one process, 4 steps (fewer than its late window's start): a row per
    explicit algorithm and per auto mode, each with a time, the late window then every step."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "bench_regret.py"), "--steps",
                          "4", "--cases", "3000/0.05/0"], capture_output=True, text=True,
                         timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    methods = {r[1] for r in rows}
    assert {"allgather", "mask", "dense", "estimate", "learn"} <= methods, out
    assert all(float(r[2]) > 0 and r[-1] == "0" for r in rows), out  # time; no wrong result
    assert "late = median over steps 1-4" in out


def test_bench_sparse_runs_on_one_rank_and_names_a_bad_size():
    """bench_sparse.py in one process (the COO bound is 0 bytes there: no ratio to it) prints
    its rows and regret table; a size it cannot read is a usage error, not a traceback."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, str(root / "bench" / "bench_sparse.py"), "--no-progress", *args],
        capture_output=True, text=True, timeout=300, cwd=root,
        env={**__import__("os").environ, "PYTHONPATH": str(root)})
    done = run("--cases", "4096/0.05/0/random", "--algorithms", "allgather,auto", "-n", "2",
               "-w", "1")
    assert done.returncode == 0 and "auto's pick" in done.stdout, done.stderr
    bad = run("--n", "abc")
    assert bad.returncode == 2 and "invalid size 'abc'" in bad.stderr and "Traceback" not in \
        bad.stderr, bad.stderr
    for args, says in ((("-n", "0"), "-n/--iters"), (("--algorithms", "bogus"), "'bogus'"),
                       (("--wire", "raw"), "'raw'"), (("--wire-values", "int8"), "'int8'"),
                       (("--overlap", "typo"), "'typo'"), (("--cases", "1K/0.01"), "a case is"),
                       (("--profiles", "missing.json"), "no such file")):
        bad = run("--n", "64K", "--width", "0", *args)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, \
            (args, bad.stderr)


def test_bench_sparse_bounds_widths_and_formats_on_two_ranks():
    """bench_sparse.py on 2 ranks: x_bound's bound is k(P-1)/P entries of an index and a row
    of the case's width; x_coo is given for a format listed before coo; -c 0 claims no
    check."""
    import subprocess

    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                           str(root / "bench" / "bench_sparse.py"), "--cases",
                           "2K/0.05/0/random,2K/0.05/16/random", "--algorithms", "allgather",
                           "--wire", "compact,coo", "-n", "1", "-w", "0", "-c", "0", "--json",
                           "-", "--no-progress"], capture_output=True, text=True, timeout=300,
                          check=True, cwd=root,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    rows = [r for r in json.loads(done.stdout)["rows"] if r["algorithm"] != "mpi_dense"]
    assert [(r["width"], r["format"]) for r in rows] == [(0, "coo"), (0, "compact"),
                                                         (16, "coo"), (16, "compact")]
    for r in rows:
        bound = r["nnz"] * (2 - 1) / 2 * (4 + 4 * max(r["width"], 1))
        assert r["wire(B)"] / r["x_bound"] == pytest.approx(bound), r
        assert r["x_coo"] != "" and r["#wrong"] == "N/A", r
    assert "# Out of bounds values : N/A (not checked: -c 0)" in done.stderr


def test_bench_topk_writes_every_part_and_x_coo_on_two_ranks(tmp_path):
    """bench_topk.py on 2 ranks, three parts, --wire compact,coo: the CSV holds the phases',
    the compressor's and the selection's rows; the compact rows have x_coo."""
    import subprocess

    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                           str(root / "bench" / "bench_topk.py"), "--only", "phases", "--only",
                           "compressor", "--only", "selection", "--n", "4K", "--steps", "2",
                           "--tau-prime", "2", "--wire", "compact,coo", "--selection-n", "4K",
                           "--repeats", "1", "--csv", "-", "--json", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=300, check=True, cwd=root,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    rows = list(csv.DictReader(done.stdout.splitlines()))
    assert {r["format"] for r in rows if r["phase"]} == {"coo", "compact"}, done.stdout
    assert len([r for r in rows if r["workload"]]) == 2 * 2 * 2  # workloads x policies x steps
    assert {r["selector"] for r in rows} >= {"one pass |x|>=t", "exact topk_abs"}
    assert all(float(r["x_coo"]) > 0 for r in rows if r["phase"] in ("reduce", "3 phases"))
    assert json.loads((tmp_path / "t.json").read_text())["rows"] != []


def test_bench_sparse_bucket_prints_each_choice_against_its_alternative(tmp_path):
    """bench/dev/bench_sparse_bucket.py, one process: the fold rows (mask sum, avg, auto),
    recursive doubling's block row, the hook's inline row and the backend's handover row, each
    two positive times and their ratio (figures only in the docs); its gloo store's folder
    is removed."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "mpi4py",
                          str(root / "bench" / "dev" / "bench_sparse_bucket.py"), "--vocab", "8K",
                          "-n", "2"], capture_output=True, text=True, timeout=300, check=True,
                         cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root),
                                        "TMPDIR": str(tmp_path)}).stdout
    assert not list(tmp_path.glob("cupycoll-gloo-*"))
    rows = [line.split(None, 1) for line in out.splitlines() if not line.startswith("#")]
    assert [r[0] for r in rows] == ["fold"] * 3 + ["block", "inline", "handover"], out
    assert all(float(v) > 0 for line in out.splitlines() if not line.startswith("#")
               for v in line.split("(")[0].split()[-3:]), out


def test_bench_mpi_reduce_refuses_cupycoll_with_reduce_scatter():
    """bench/dev/bench_mpi_reduce.py --cupycoll times cc.reduce only: with --verb
    reduce_scatter it is a usage error, not a flag ignored."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "dev" / "bench_mpi_reduce.py"),
                           "--verb", "reduce_scatter", "--cupycoll", "--sizes", "8", "-n", "1"],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 2 and "--cupycoll" in done.stderr, done.stderr


def test_bench_torch_settle_prints_every_way():
    """bench/dev/bench_torch_settle.py, one process, one short round: a positive median per
    way of completing the operation."""
    pytest.importorskip("torch")
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "mpi4py",
                          str(root / "bench" / "dev" / "bench_torch_settle.py"), "-n", "5",
                          "--rounds", "1"], capture_output=True, text=True, timeout=300,
                         check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.rsplit(None, 1) for line in out.splitlines() if not line.startswith("#")]
    assert [r[0].strip() for r in rows] == ["future", "future inline", "wait", "sync"], out
    assert all(float(r[1]) > 0 for r in rows), out


def test_bench_torch_algorithms_prints_every_algorithm_on_both_gradients():
    """bench/dev/bench_torch_algorithms.py, one process, both gradients: one positive median
    per algorithm it runs and the numpy sort that controls the machine (figures only in the
    docs); with ``--cpu``, a row per algorithm of the rank's user and system milliseconds per
    call, user above zero; with ``--gloo`` gloo's call too, and ``--idle`` taken."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    names = ["allgather", "mask", "recursive_doubling", "split", "auto"]
    for gradient, cpu in (("bench", ["--cpu"]), ("backend", ["--gloo", "--idle", "1"])):
        out = subprocess.run([sys.executable, "-m", "mpi4py",
                              str(root / "bench" / "dev" / "bench_torch_algorithms.py"),
                              "--vocab", "8K", "--gradient", gradient, "-n", "2", "-w", "1",
                              *cpu],
                             capture_output=True, text=True, timeout=300, check=True, cwd=root,
                             env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
        line, *rows = [line for line in out.splitlines() if not line.startswith("#")]
        words = line.split()
        assert words[::2] == names + (["gloo"] if "--gloo" in cpu else []) + ["numpy.sort"], out
        assert ("idle 1 ms" in out) == ("--idle" in cpu), out
        assert all(float(t) > 0 for t in words[1::2]), out
        assert [row.split()[0] for row in rows] == (names if "--cpu" in cpu else []), out
        for row in rows:  # "<name> <user> + <system>" (one rank)
            _, user, plus, system = row.split()
            assert plus == "+" and float(user) > 0 and float(system) >= 0, out


def test_bench_learn_rule_runs_both_learners_side_by_side():
    """bench/dev/bench_learn_rule.py on 2 ranks (learn times calls only there), 40 steps: the
    learn and learn-median rows, each with a time and what it ran, no wrong result."""
    import subprocess

    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                          str(root / "bench" / "dev" / "bench_learn_rule.py"), "--steps", "40",
                          "--cases", "20000/0.05/0", "--no-progress"], capture_output=True,
                         text=True, timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = {r[1]: r for r in (line.split() for line in out.splitlines())
            if r and not r[0].startswith("#")}
    assert {"learn", "learn-median", "estimate"} <= set(rows), out
    assert all(float(r[2]) > 0 and r[-1] == "0" for r in rows.values()), out
    import cupycoll
    assert rows["learn-median"][6] in cupycoll.algorithms("sparse"), out  # ran late


def test_bench_allgather_phases_prices_both_phases():
    """bench/dev/bench_allgather_phases.py on 2 ranks: a small case with both phases measured
    and priced (positive times and ratios), and a case of no entries, priced 0 (no ratio)."""
    import subprocess

    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                          str(root / "bench" / "dev" / "bench_allgather_phases.py"),
                          "--cases", "20000/0.05/4,100/0.001/0", "--repeats", "3"],
                         capture_output=True, text=True, timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    assert [r[0] for r in rows] == ["20000/0.05/4", "100/0.001/0"], out
    assert all(float(v) > 0 for v in rows[0][1:]), out
    assert rows[1][3] == rows[1][6] == "-", out


def test_bench_blocked_wait_reports_each_waiting_ranks_cpu_of_either_call():
    """bench/dev/bench_blocked_wait.py on 3 ranks: one late call through MPI, then a few short
    waits through cupycoll's wait: a CPU figure per waiting rank (ranks 1 and 2), each
    non-negative and below the run's wall time."""
    import re
    import subprocess

    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    for args in (["--late", "0.05"], ["--via", "cupycoll", "--late", "0.003", "--calls", "20"]):
        out = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py",
                              str(root / "bench" / "dev" / "bench_blocked_wait.py"), *args],
                             capture_output=True, text=True, timeout=120, check=True, cwd=root,
                             env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("3 ranks"))
        assert ("cupycoll, 20 calls" if "--calls" in args else "mpi, rank 0 late") in line, out
        cpu = [float(v) for v in line.split("waits: ")[1].split(", ")]
        wall = float(re.search(r"\((\d+\.\d+) s\)", line)[1]) if "--calls" in args else 0.05
        assert len(cpu) == 2 and all(0 <= v < wall + 0.5 for v in cpu), out


def test_bench_arena_times_blocks_in_place_and_copied():
    """bench/dev/bench_arena.py on 2 ranks, two sizes: a row each with the arena's bound of
    the call's bytes, positive medians of recursive doubling in place and copied and of
    allgather, and their ratio."""
    import subprocess

    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                          str(root / "bench" / "dev" / "bench_arena.py"), "--entries", "100,2K",
                          "-n", "3", "-w", "1"],
                         capture_output=True, text=True, timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    assert [r[0] for r in rows[1:]] == ["100", "2048"], out  # (after the header)
    from cupycoll.sparse.recursive_doubling import arena_bytes
    assert int(rows[2][1]) == arena_bytes([2048, 2048], 20480, 4, 4), out
    assert all(float(v) > 0 for r in rows[1:] for v in r[2:]), out


def test_bench_fixed_reprices_every_priced_algorithm():
    """bench/dev/bench_fixed.py on 2 ranks, one short pass: a row per priced algorithm with the
    profile's fixed cost, today's and the re-priced one (today's times the median ratio, so
    the re-priced median ratio is 1), and the re-priced values as JSON."""
    import json
    import statistics
    import subprocess

    import cupycoll
    from tests._mpi import mpiexec
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
                          str(root / "bench" / "dev" / "bench_fixed.py"), "--passes", "1",
                          "--repeats", "2"], capture_output=True, text=True, timeout=300,
                         check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = {r[0]: r for r in (line.split() for line in out.splitlines())
            if r and not r[0].startswith("#")}
    assert set(rows) == set(cupycoll.algorithms("sparse")) - {"auto"}, out
    assert all(float(r[1]) > 0 and float(r[2]) >= 0 for r in rows.values()), out
    repriced = json.loads(out.split("# repriced ", 1)[1])
    assert set(repriced) == set(rows)
    ratios = [float(rows[a][1]) * 1e-6 / repriced[a] for a in rows if repriced[a] > 0]
    assert abs(statistics.median(ratios) - 1) < 0.02, out


def test_bench_sparse_prices_a_case_as_the_front_door_does(monkeypatch):
    """bench_sparse's Shape of a case (its pick) has the front door's ``host`` and
    ``in_place``: blocks read in place on a communicator whose ranks share a node, from the
    arena's least size on; copied below it and where the ranks do not share a node."""
    pytest.importorskip("mpi4py")
    import bench_sparse
    from cupycoll.comm import _mpi_arena
    from cupycoll._types import ReduceOp
    from cupycoll.sparse._validate import Prepared

    comm = type("Comm", (), {"size": 2, "backend": "mpi", "xp": np})()  # (weakly referable)
    n, width = 1 << 20, 4
    for shared in (True, False):
        monkeypatch.setattr(_mpi_arena, "shares_node", lambda c, shared=shared: shared)
        for k in (100, 1 << 14):
            inputs = [(np.arange(r, 2 * k, 2, dtype=np.int32), np.ones((k, width), np.float32))
                      for r in range(2)]
            bench = bench_sparse.auto_shape(comm, inputs, n, width, "sparse")
            door = Prepared(None, None, n, ReduceOp.SUM, "auto", np.dtype(np.int32),
                            np.dtype(np.float32), np.dtype(np.float32), width,
                            nnz=(k, k)).shape(comm)
            assert (bench.host, bench.in_place) == (door.host, door.in_place) == (
                True, shared and k > 100), (shared, k)


def test_bench_sparse_runs_learns_trials_untimed_and_shows_its_choice(monkeypatch):
    """bench_sparse under CUPYCOLL_AUTO=learn: each auto call runs 1 + learn.TRIAL_CALLS
    untimed calls first, and the pick shown is the choice of the class those calls fed (an
    older class on the communicator is not it); under estimate, no trials."""
    pytest.importorskip("mpi4py")
    import bench_sparse
    from cupycoll.sparse import learn

    comm = SimpleNamespace(size=2)
    learn.records(comm)[("older",)] = learn.Record(["split"], calls=5)
    made = []

    def auto_call():  # stands in for sparse_allreduce(algorithm="auto"): one timed call
        made.append(1)
        record = learn.records(comm).setdefault(("fed",), learn.Record(["mask", "dense"]))
        record.calls += 1

    monkeypatch.setenv("CUPYCOLL_AUTO", "estimate")
    assert bench_sparse.learn_trials(comm, {"auto": auto_call}) == {} and not made
    monkeypatch.setenv("CUPYCOLL_AUTO", "learn")
    classes = bench_sparse.learn_trials(comm, {"auto": auto_call})
    assert len(made) == 1 + learn.TRIAL_CALLS and classes == {"auto": ("fed",)}
    assert bench_sparse.learned_pick(comm, classes["auto"]) == "mask"
    assert bench_sparse.learned_pick(comm, None) is None


@pytest.mark.parametrize("parts", [2, 3])
def test_bench_merge_rows_prints_every_width(parts):
    """bench/dev/bench_merge_rows.py, one process, numpy loops: a row per width, the 1-D one
    the unit of ``x 1-D``; beyond two parts the measured merge without a model."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "dev" / "bench_merge_rows.py"),
                          "--widths", "0,4", "--k", "512", "--n", "8192", "--repeats", "3",
                          "--parts", str(parts)],
                         capture_output=True, text=True, timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [0, 4] and all(float(r[1]) > 0 for r in rows)
    if parts == 2:
        assert rows[0][4] == "1.00" and all(float(r[2]) > 0 for r in rows)
    else:
        assert all(r[2] == "-" for r in rows)


@pytest.mark.parametrize("flags", [["--log2n", "6", "--density", "0.001"], ["--log2n", "4",
                                                                           "--sweep"]])
def test_bench_wire_runs_at_a_small_n(flags):
    """bench/bench_wire.py where some densities draw fewer indices than a row needs (none for
    the sizes, fewer than two for the sweep's gaps): those rows are left out, the others
    printed; the timed stream may be empty."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "bench_wire.py"), *flags,
                          "--impl", "numpy", "--reps", "2"], capture_output=True, text=True,
                         timeout=300, check=True, cwd=root,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert rows
    if "--sweep" in flags:  # sizes only: nothing checked, no footer claiming a check
        assert "Out of bounds" not in out
        assert {float(r[0]) for r in rows} <= {1e-3, 1e-2, 0.05, 0.1, 0.3}
    else:
        assert "# Out of bounds values : 0 OK" in out
        assert any(r[0] == "encode_indices" for r in rows)


@pytest.mark.parametrize("script,flags", [("bench_dense.py", ["-b", "8", "-e", "64"]),
                                          ("bench_dense.py", ["--vs-mpi", "--sizes", "10,64",
                                                              "-n", "1", "-w", "0"]),
                                          ("bench_wire.py", ["--log2n", "12", "--impl",
                                                             "numpy", "--reps", "2"]),
                                          ("bench_syncs.py", ["--n", "64", "--nnz", "4",
                                                              "--k", "2"]),
                                          ("dev/bench_primitives.py", ["--log2n", "12",
                                                                       "--log2k", "6", "--reps",
                                                                       "1", "--impl", "numpy"])])
def test_json_to_stdout_is_all_that_stdout_carries(script, flags, tmp_path):
    """--json - leaves stdout to the JSON document (the table goes to stderr); --csv - alike;
    an output path in a folder that is not there is a usage error before the run."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}

    def run(*extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(root / "bench" / script), *flags, *extra],
                              capture_output=True, text=True, timeout=300, check=check,
                              cwd=root, env=env)

    done = run("--json", "-")
    assert json.loads(done.stdout)["rows"] and "#" in done.stderr
    if script == "bench_wire.py":  # GB/s in: the bytes each operation reads
        rows = [r for r in json.loads(done.stdout)["rows"] if "operation" in r]
        read = {(r["operation"], r["impl"]): r["GB/s in"] * r["best(ms)"] * 1e6 for r in rows}
        k = int(rows[0]["case"].split("k=")[1])
        assert read["encode_indices", "numpy"] == pytest.approx(4 * k)
        assert read["decode_indices", "numpy"] < 2 * k  # the encoded stream: ~1 byte an index
        assert read["round_values", "float16"] == pytest.approx(4 * k)
        assert read["widen_values", "float16"] == pytest.approx(2 * k)
    if script == "bench_dense.py":  # -c 0: nothing checked, none claimed
        unchecked = () if "--vs-mpi" in flags else ("-c", "0")
        done = run("--csv", "-", *unchecked)
        rows = list(csv.DictReader(done.stdout.splitlines()))
        assert {r["size(B)"] for r in rows} == ({"8", "64"} if "--vs-mpi" in flags
                                                else {"8", "16", "32", "64"})
        if unchecked:
            assert {r["#wrong"] for r in rows} == {"N/A"}, done.stdout
            assert "# Out of bounds values : N/A (not checked: -c 0)" in done.stderr
    missing = run("--json", str(tmp_path / "no" / "r.json"), check=False)
    assert missing.returncode == 2 and "no folder" in missing.stderr, missing.stderr
    if script == "bench_syncs.py":  # --json=~/r.json: the shell leaves ~ as it is there
        env["HOME"] = str(tmp_path)
        run("--json=~/r.json")
        assert json.loads((tmp_path / "r.json").read_text())["rows"]
        assert not (root / "~").exists()


def test_convergence_demo_json_to_stdout(tmp_path):
    """convergence_demo.py --json -: stdout carries the JSON alone (no file named '-'); without
    --plot the curves go to convergence_d<density>.png in the working directory."""
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    import subprocess
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "bench" / "convergence_demo.py"),
                           "--epochs", "1", "--hidden", "8", "--algorithms", "dense-sgd",
                           "--json", "-"], capture_output=True, text=True, timeout=300,
                          check=True, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert json.loads(done.stdout)["results"][0]["algorithm"] == "dense-sgd", done.stdout
    assert "# digits MLP" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convergence_d0.01.png"]


def test_a_cell_wider_than_its_column_is_set_off(capsys):
    table = _common.Table(["size(B)", "type"], rank=0)
    table.add({"size(B)": 123456789012345, "type": "complex128-bfloat16x"})
    assert capsys.readouterr().out.split() == ["123456789012345", "complex128-bfloat16x"]


FOLDER = str(Path(__file__).resolve().parent)  # an output path that is a folder


@pytest.mark.parametrize("name,args,says", [
    ("dense", ["-n", "0"], "argument -n/--iters: must be an int >= 1"),
    ("dense", ["-n", "-1"], "argument -n/--iters"),
    ("dense", ["-d", "garbage"], "argument -d/--datatype: must be one of float16"),
    ("dense", ["--root", "1"], "--root 1: must be below the number of ranks, 1"),
    ("dense", ["--json", FOLDER], f"--json: {FOLDER!r} is a folder"),
    ("sparse", ["--skew", "-3"], "argument --skew: must be a finite number >= 0"),
    ("sparse", ["--seed", "-1"], "argument --seed: must be an int >= 0"),
    ("topk", ["--n", "0"], "argument --n: invalid size '0': must be at least 1"),
    ("topk", ["--density", "0"], "argument --density: must be a number in (0, 1]"),
    ("topk", ["--steps", "-1"], "argument --steps"),
    ("topk", ["--only", "phases", "--steps", "1"], "at least 2 each"),
    ("topk", ["--only", "algorithms", "--tau-prime", "1"], "at least 2 each"),
    ("topk", ["--plot", "p.png"], "unrecognized arguments: --plot"),
    ("sparse", ["--cases", "16/0.5/-2/random"], "every width >= 0"),
    ("dense", ["--vs-mpi", "--plot", "p.png"], "--vs-mpi draws nothing"),
    ("dense", ["--vs-mpi", "-o", "max"], "-e, -o: --vs-mpi times float32 sum"),
    ("dense", ["--vs-mpi", "-d", "float64"], "-d: --vs-mpi times float32 sum"),
    ("dense", ["--sizes", "1M"], "--sizes: the sizes of --vs-mpi"),
    ("topk", ["--wire", "bogus"], "argument --wire: must be one of coo, compact, auto, got 'bogus'"),
    ("topk", ["--repeats", "0"], "argument --repeats"),
    ("small", ["-n", "0"], "argument -n/--iters"),
    ("small", ["--block", "-1"], "argument --block"),
    ("small", ["--length", "0"], "argument --length"),
    ("small", ["--length", "5", "-k", "6"], "at most --length 5"),
    ("wire", ["--reps", "0"], "argument --reps"),
    ("wire", ["--log2n", "70"], "at most 31"),
    ("syncs", ["--n", "0"], "argument --n"),
    ("syncs", ["--json", FOLDER], "is a folder"),
    ("regret", ["--cases", "garbage"], "argument --cases: a case is n/density/width"),
    ("regret", ["--cases", "1000/0.01"], "got '1000/0.01'"),
    ("regret", ["--cases", "1000/0.01/0", "--steps", "0"], "argument --steps"),
    ("demo", ["--epochs", "0"], "argument --epochs"),
    ("demo", ["--json", FOLDER], "is a folder"),
    ("torch", ["--vocab", "0"], "argument --vocab"),
])
def test_a_benchmark_refuses_a_bad_argument_before_it_runs(name, args, says, capsys,
                                                           monkeypatch):
    """A count, size, fraction, dtype or choice out of range (or a rank that is not there, an
    output path that is a folder) is a usage error naming it (exit status 2, no traceback),
    not a traceback after init() or a table of nan or negative times (the benchmark runs in
    this process, as ``cupycoll bench NAME``; --root's check after init(), at P = 1)."""
    if name == "torch":
        pytest.importorskip("torch")
    from cupycoll._cli import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    short = {"dense": ["-b", "8", "-e", "8", "-w", "0"], "small": ["-w", "0"],
             "topk": ["--only", "selection", "--selection-n", "1K"],
             "sparse": ["--cases", "1K/0.1/0/random", "-n", "1"],
             "wire": ["--log2n", "10", "--impl", "numpy"]}  # short, were they to run
    assert main(["bench", name, *short.get(name, []), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "error:" in err and "Traceback" not in err, err


def test_the_developer_probes_refuse_zero_repetitions():
    """Every count of repetitions, rounds or calls a probe under bench/dev takes is an int >= 1
    (argparse's ``positive_int``: 0 timed nothing and printed a median of nothing, or raised),
    read from each probe's parser; bench_merge_rows also refuses more entries than indices."""
    import ast
    import subprocess

    root = Path(__file__).resolve().parents[1]
    counts = {"--repeats", "--reps", "--rounds", "--iters", "-n"}
    seen = 0
    for path in sorted((root / "bench" / "dev").glob("bench_*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") ==
                    "add_argument"):
                continue
            names = {a.value for a in call.args if isinstance(a, ast.Constant)}
            if not names & counts:
                continue
            kind = {k.arg: k.value for k in call.keywords}.get("type")
            assert getattr(kind, "id", None) == "positive_int", (path.name, names)
            seen += 1
    assert seen >= 14, seen
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, str(root / "bench" / "dev" / "bench_merge_rows.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=root,
        env={**__import__("os").environ, "PYTHONPATH": str(root)})
    for args, says in ((("--repeats", "0"), "an int >= 1"), (("--k", "10", "--n", "5"),
                                                               "--k (10) must be at most")):
        bad = run(*args)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, \
            (args, bad.stderr)
