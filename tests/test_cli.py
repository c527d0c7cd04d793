"""The ``cupycoll`` command (python -m cupycoll): info and bench, run as a user would."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cupycoll._cli import BENCHMARKS, bench_script, info_lines
from cupycoll._config import SETTINGS
from tests._mpi import mpiexec

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run(*args: str, nprocs: int = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cupycoll", *args]
    if nprocs:
        cmd = [mpiexec(), "-n", str(nprocs), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV,
                          cwd=ROOT, start_new_session=True)


def test_info_reports_versions_settings_and_backend():
    proc = run("info")
    assert proc.returncode == 0, proc.stderr
    names = [line.split("  ")[0].strip() for line in proc.stdout.splitlines()]
    for name in ("cupycoll", "python", "numpy", "mpi4py", "MPI library", "numba", "cupy",
                 "cuda runtime", "cuda driver", "nccl", "devices", "init() backend",
                 *SETTINGS):
        assert name in names, f"{name} missing from:\n{proc.stdout}"
    assert "MPICH" in proc.stdout  # the mpich wheel of the test extra
    assert "init() backend" in proc.stdout and ("mpi (" in proc.stdout or "nccl (" in proc.stdout)


def test_info_shows_where_each_setting_comes_from(monkeypatch):
    monkeypatch.setenv("CUPYCOLL_TIMEOUT", "7")
    monkeypatch.setenv("CUPYCOLL_BACKEND", "mpi")
    lines = dict(info_lines())
    assert lines["CUPYCOLL_TIMEOUT"] == "7.0 (environment)"
    assert lines["CUPYCOLL_ALGORITHM"] == "'auto' (default)"
    assert lines["init() backend"] == "mpi (CUPYCOLL_BACKEND says so)"


def test_info_shows_the_paths_that_stand_for_an_unset_path_setting(monkeypatch, tmp_path):
    """CUPYCOLL_PROFILE and CUPYCOLL_EMULATION_CACHE unset: the file and folder in effect."""
    for name in ("CUPYCOLL_PROFILE", "CUPYCOLL_EMULATION_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # what gettempdir() says
    profile = tmp_path / "cupycoll" / "profile.json"
    lines = dict(info_lines())
    assert lines["CUPYCOLL_PROFILE"] == f"None: {profile} (absent: the shipped profile) (default)"
    folder = tmp_path / "tmp" / f"cupycoll-emulation-{os.getuid()}"
    assert lines["CUPYCOLL_EMULATION_CACHE"] == f"None: {folder} (default)"
    assert not folder.exists()  # info makes nothing
    profile.parent.mkdir()
    profile.write_text("{}")
    assert dict(info_lines())["CUPYCOLL_PROFILE"] == f"None: {profile} (default)"


@pytest.mark.parametrize("name, value", [("CUPYCOLL_TIMEOUT", "soon"),
                                         ("CUPYCOLL_ALGORITHM", "nope"),
                                         ("CUPYCOLL_WIRE", "zzz"),
                                         ("CUPYCOLL_TOPK_ALGORITHM", "garbage"),
                                         ("CUPYCOLL_BACKEND", "MPI"),
                                         ("CUPYCOLL_LOG_LEVEL", "bogus")])
def test_info_survives_a_bad_setting(monkeypatch, name, value):
    """A value that cannot be parsed, or names an algorithm or wire every call refuses, is
    shown as unavailable with the error a call raises."""
    monkeypatch.setenv(name, value)
    shown = dict(info_lines())[name]
    assert shown.startswith("unavailable (InvalidArgument") and shown.endswith("(environment)")
    assert name in shown, shown


@pytest.mark.parametrize("value, says", [("garbage", "none: init() raises InvalidArgument"),
                                         ("mpi", "mpi (CUPYCOLL_BACKEND says so)")])
def test_info_says_what_init_would_do_with_the_backend_asked_for(monkeypatch, value, says):
    monkeypatch.setenv("CUPYCOLL_BACKEND", value)
    assert dict(info_lines())["init() backend"].startswith(says)


@pytest.mark.parametrize("name, value", [("CUPYCOLL_AUTOO", "learn"), ("CUPYCOLL_TIMEOUT", "soon"),
                                         ("CUPYCOLL_LOG_LEVEL", "loud"),
                                         ("CUPYCOLL_SPIN", "junk"),
                                         ("CUPYCOLL_REDUCE_PAIRWISE", "-5"),
                                         ("CUPYCOLL_CONNECT_TIMEOUT", "never")])
def test_info_says_init_raises_where_a_setting_stops_it(monkeypatch, name, value):
    """A misspelled setting, a bad timeout or log level: init() raises before it picks."""
    monkeypatch.setenv(name, value)
    said = dict(info_lines())["init() backend"]
    assert said.startswith("none: init() raises InvalidArgument") and name in said, said


def test_tune_names_a_backend_it_cannot_use():
    """An unknown backend is a usage error; nccl where no GPU is, a message (no traceback)."""
    bogus = run("tune", "--backend", "bogus")
    assert bogus.returncode == 2 and "invalid choice: 'bogus'" in bogus.stderr
    from cupycoll.comm import nccl_usable

    if not nccl_usable():
        nccl = run("tune", "--backend", "nccl")
        assert nccl.returncode == 1 and "BackendUnavailable" in nccl.stderr
        assert "Traceback" not in nccl.stderr, nccl.stderr


def test_tune_checks_the_profile_s_default_file_before_it_measures(tmp_path, monkeypatch):
    """CUPYCOLL_PROFILE naming a folder, or a file under a file: a usage error at once, not a
    traceback after the whole measurement."""
    from cupycoll._cli import main

    (tmp_path / "afile").write_text("")
    for bad in (tmp_path, tmp_path / "afile" / "x.json"):
        monkeypatch.setenv("CUPYCOLL_PROFILE", str(bad))
        assert main(["tune", "--repeats", "1"]) == 2


def test_tune_with_rank_0s_profile_file_unwritable_ends_every_rank(tmp_path):
    """Rank 0 (which writes the profile) has CUPYCOLL_PROFILE naming a folder, rank 1 not:
    every rank exits 2 with the reason at once (before: rank 0 returned before init() while
    rank 1 waited there for ever)."""
    tune = [sys.executable, "-m", "cupycoll", "tune", "--repeats", "1"]
    proc = subprocess.run([mpiexec(), "-n", "1", "-env", "CUPYCOLL_PROFILE", str(tmp_path),
                           *tune, ":", "-n", "1", *tune], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=ROOT, start_new_session=True)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("cupycoll tune: error: CUPYCOLL_PROFILE:") == 2, proc.stderr


def test_simulate_takes_both_as_its_help_says(capsys):
    """--family both and --output both, as the help and the error text offer them."""
    from cupycoll._cli import main

    assert main(["simulate", "--family", "both", "--output", "both", "--P", "2",
                 "--networks", "eth100"]) == 0
    table = capsys.readouterr().out
    assert "| sparse | eth100 | coo |" in table and "| topk | eth100 |" in table
    assert "coo/dense" in table


def test_simulate_refuses_shapes_that_cannot_be():
    """A length below 1, a density outside (0, 1], a negative width or skew, a width from 2**62
    (an OverflowError's traceback before), NaN: usage
    errors (status 2) naming the option, never negative times."""
    from cupycoll._cli import main

    for option, value in (("--n", "0"), ("--n", "-5"), ("--density", "-0.1"),
                          ("--density", "2"), ("--density", "nan"), ("--width", "-1"),
                          ("--width", str(2**62)), ("--skew", "-5"), ("--skew", "nan")):
        with pytest.raises(SystemExit) as info:
            main(["simulate", "--family", "sparse", "--P", "2", "--networks", "eth100",
                  option, value])
        assert info.value.code == 2, (option, value)


@pytest.mark.parametrize("option,value,says", [
    ("--networks", "bogus", "argument --networks: must be one of nvlink"),
    ("--family", "bogus", "argument --family: must be one of sparse, topk, both, got 'bogus'"),
    ("--wire", "coo,bogus", "argument --wire: unknown wire format 'bogus'"),
    ("--output", "bogus", "argument --output: must be one of sparse, dense, both, got 'bogus'"),
    ("--P", "0", "argument --P: must be an int from 1 to 1048576, got '0'"),
    ("--P", "2,x", "argument --P: must be an int from 1 to 1048576, got 'x'"),
    ("--P", "100000000", "argument --P: must be an int from 1 to 1048576, got '100000000'"),
    ("--n", "1.5", "argument --n: invalid size '1.5': not a whole number"),
    ("--n", "16q", "argument --n: invalid size '16q'"),
    ("--n", "1e30", "argument --n: invalid size '1e30': must be below 2**62"),
])
def test_simulate_names_a_bad_argument_as_a_usage_error(option, value, says, capsys):
    """Every bad value is an argparse usage error (exit status 2, ``cupycoll simulate:
    error:`` naming the option and the text as given), none a bare exit 1 nor a truncation."""
    from cupycoll._cli import main

    with pytest.raises(SystemExit) as info:
        main(["simulate", "--family", "sparse", "--P", "2", "--networks", "eth100", option,
              value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "cupycoll simulate: error: " + says in err, err


def test_simulate_reads_sizes_as_the_benchmarks_do(tmp_path):
    """--n takes the benchmarks' sizes: 16MiB, 16MB and 1T as powers of 1024."""
    from cupycoll._cli import main

    for text, n in (("16MiB", 16 << 20), ("16MB", 16 << 20), ("1T", 1 << 40), ("1e6", 10**6)):
        out = tmp_path / f"{text}.json"
        assert main(["simulate", "--family", "topk", "--P", "2", "--networks", "eth100",
                     "--n", text, "--json", str(out)]) == 0
        assert {row["n"] for row in json.loads(out.read_text())["rows"]} == {n}, text


def test_bench_prints_a_benchmark_s_traceback_once(tmp_path, monkeypatch, capsys):
    """A benchmark that raises: its traceback printed once (before an abort could end the
    rank), exit status 1, not the exception raised again for the interpreter to print."""
    import cupycoll._cli as cli

    script = tmp_path / "bench_boom.py"
    script.write_text("raise RuntimeError('boom')\n")
    monkeypatch.setattr(cli, "bench_script", lambda name: script)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["bench", "dense"]) == 1
    err = capsys.readouterr().err
    assert err.count("Traceback") == 1 and "RuntimeError: boom" in err, err


def test_bench_root_beyond_the_ranks_ends_every_rank_with_a_usage_error():
    """--root is checked once the number of ranks is known: P = 2, --root 2 is a usage error
    on every rank (exit status 2, no traceback), not a traceback in the first broadcast."""
    proc = run("bench", "dense", "--collective", "broadcast", "--root", "2", "-b", "8", "-e",
               "8", "-n", "1", "-w", "0", nprocs=2)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "error: --root 2: must be below the number of ranks, 2" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_listed_benchmark_exists(name):
    assert bench_script(name).is_file()


def test_bench_dense_on_two_ranks():
    proc = run("bench", "dense", "-b", "8", "-e", "1K", "-f", "4", "-n", "2", "-w", "1",
               "--no-progress", nprocs=2)
    assert proc.returncode == 0, proc.stderr
    rows = [r.split() for r in proc.stdout.splitlines() if r.strip() and not r.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 32, 128, 512, 1024][:len(rows)] and len(rows) >= 4
    assert all(r[-1] == "0" for r in rows), proc.stdout  # #wrong


def test_bench_passes_arguments_and_exit_status():
    proc = run("bench", "sparse", "--help")
    assert proc.returncode == 0 and "--density" in proc.stdout
    assert "\n    mpiexec -n 4 python -m mpi4py bench/bench_sparse.py --width 64 --json " \
        "rows.json\n" in proc.stdout  # the examples as written, one a line
    for flags, says in ((["-c", "7"], "0 or 1"), (["-f", "1"], "an int >= 2"),
                        (["-b", "64", "-e", "8"], "no size to run")):
        proc = run("bench", "dense", *flags)
        assert proc.returncode == 2 and says in proc.stderr, (flags, proc.stderr)
    proc = run("bench", "dense", "--no-such-flag")
    assert proc.returncode == 2 and "--no-such-flag" in proc.stderr
    proc = run("bench", "nosuch")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_bench_refusing_an_argument_on_one_rank_ends_the_job():
    """An argument one rank refuses (its exit status 2) aborts the whole job, as ``python -m
    mpi4py`` does, instead of leaving the other ranks in the benchmark's first collective."""
    good = ["-b", "8", "-e", "1K", "-n", "1", "-w", "0", "--no-progress"]
    cmd = [mpiexec(), "-n", "1", sys.executable, "-m", "cupycoll", "bench", "dense", *good,
           ":", "-n", "1", sys.executable, "-m", "cupycoll", "bench", "dense", *good,
           "--no-such-flag"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=ENV, cwd=ROOT,
                          start_new_session=True)
    assert proc.returncode != 0 and "--no-such-flag" in proc.stderr


def test_every_benchmark_script_is_reachable():
    """``cupycoll bench`` offers exactly the scripts at bench/'s top level; the developer probes
    in bench/dev/ are not offered."""
    shipped = {p.stem[len("bench_"):] for p in (ROOT / "bench").glob("bench_*.py")}
    assert shipped | {"demo"} == set(BENCHMARKS), shipped ^ set(BENCHMARKS)
    probes = {p.stem[len("bench_"):] for p in (ROOT / "bench" / "dev").glob("bench_*.py")}
    assert probes and not probes & set(BENCHMARKS), probes & set(BENCHMARKS)
    proc = run("bench", "host")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.parametrize("script", ["bench_primitives.py", "bench_mpi_reduce.py"])
def test_developer_probes_run_from_the_source_tree(script):
    """The probes in bench/dev/ reach bench/_common.py from their folder (--help imports it)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dev" / script), "--help"],
                          capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT)
    assert proc.returncode == 0 and "usage" in proc.stdout, proc.stderr


def test_an_output_path_that_cannot_be_written_is_a_usage_error_before_any_work(tmp_path):
    """tune, selftest and simulate check their output files when they parse them (exit status
    2 naming the argument), not after minutes of measuring; a missing folder is made."""
    afile = tmp_path / "afile"
    afile.write_text("")
    too_long = str(tmp_path / ("x" * 300 + ".json"))  # a name the system refuses to look up
    for args in (["tune", "--repeats", "1", "--output", str(afile / "p.json")],
                 ["tune", "--output", too_long], ["simulate", "--json", too_long],
                 ["simulate", "--json", "~nosuchuser_zz/x.json"],
                 ["tune", "--output", str(tmp_path)], ["tune", "--output", ""],
                 ["selftest", "--json", str(afile / "st.json")],
                 ["selftest", "--report", str(tmp_path)],
                 ["simulate", "--json", str(afile / "x.json")],
                 ["simulate", "--plot", str(afile / "x.png")]):
        proc = run(*args, timeout=60)
        assert proc.returncode == 2 and ("cannot be written" in proc.stderr or
                                         "is a folder" in proc.stderr), (args, proc.stderr)
    made = tmp_path / "new" / "folder" / "rows.json"
    proc = run("simulate", "--P", "2", "--networks", "machine", "--json", str(made))
    assert proc.returncode == 0 and json.loads(made.read_text())["rows"], proc.stderr


def test_simulate_with_nothing_to_price_is_a_usage_error():
    """No network, wire or output named, or no network holding --P ranks: exit status 2 and
    why, not a header row without its rows."""
    for args in (["--networks", ""], ["--wire", ""], ["--family", "sparse", "--output", ""],
                 ["--P", "16", "--networks", "nvlink"]):
        proc = run("simulate", *args, timeout=60)
        assert proc.returncode == 2 and "nothing to simulate" in proc.stderr, (args, proc)


#: a sitecustomize that fails ``from mpi4py import MPI`` as mpi4py does without an MPI library
NO_MPI_LIBRARY = """import sys
class _NoLibrary:
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI":
            raise RuntimeError("cannot load MPI library")
sys.meta_path.insert(0, _NoLibrary())
"""


def test_no_mpi_library_leaves_import_help_and_info_working(tmp_path):
    """mpi4py installed but no MPI library: ``import cupycoll``, ``--help`` and ``info`` work
    (info says so), and ``init()`` raises BackendUnavailable naming the ``mpi`` extra."""
    (tmp_path / "sitecustomize.py").write_text(NO_MPI_LIBRARY)
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=120, env=env, cwd=ROOT)

    code = ("import cupycoll as cc\n"
            "try:\n    cc.init()\n"
            "except cc.errors.BackendUnavailable as exc:\n    print('refused:', exc)\n")
    refused = python("-c", code)
    assert refused.returncode == 0, refused.stderr
    assert "refused: no MPI library" in refused.stdout
    assert "pip install 'cupycoll[mpi]'" in refused.stdout
    assert python("-m", "cupycoll", "--help").returncode == 0
    info = python("-m", "cupycoll", "info")
    assert info.returncode == 0, info.stderr
    lines = {name: value.strip() for name, _, value in
             (line.partition("  ") for line in info.stdout.splitlines())}
    assert lines["MPI library"] == "unavailable (RuntimeError: cannot load MPI library)"
    assert lines["init() backend"].startswith("none: init() raises BackendUnavailable")
    bench = python("-m", "cupycoll", "bench", "dense", "--help")
    assert bench.returncode == 1 and "Traceback" not in bench.stderr, bench.stderr
    assert "cupycoll bench: no MPI library" in bench.stderr and "cupycoll[mpi]" in bench.stderr


BENCH = str(ROOT / "bench")


@pytest.mark.parametrize("hidden,args,extra", [
    ("torch", [f"{BENCH}/bench_torch.py", "--help"], "torch"),
    ("matplotlib", [f"{BENCH}/bench_dense.py", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
                    "--no-progress", "--plot", "p.png"], "plot"),
    ("matplotlib", ["-m", "cupycoll", "simulate", "--P", "2", "--networks", "ib400", "--plot",
                    "p.png"], "plot"),
    ("cupy", [f"{BENCH}/bench_syncs.py", "--backend", "emulated"], "gpu-cu12"),
], ids=["bench-torch", "bench-plot", "simulate-plot", "syncs-emulated"])
def test_a_missing_optional_package_is_a_message_naming_its_extra(tmp_path, hidden, args, extra):
    """Without the optional package a command needs: one message naming the extra, before any
    run (no traceback, no output file). The benchmarks run as scripts (what ``cupycoll bench
    NAME`` runs): this checkout's, whichever one an installed ``cupycoll.bench`` points at."""
    (tmp_path / "sitecustomize.py").write_text(f"import sys\nsys.modules[{hidden!r}] = None\n")
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert proc.returncode in (1, 2), proc.stdout
    assert f"pip install 'cupycoll[{extra}]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "p.png").exists() and "time(us)" not in proc.stdout


def test_importing_cupycoll_torch_without_torch_names_the_extra(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    code = ("try:\n    import cupycoll.torch\n"
            "except ModuleNotFoundError as exc:\n    print(exc.name, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path, check=True).stdout
    assert out.startswith("torch cupycoll.torch needs PyTorch") and "'cupycoll[torch]'" in out


def test_tune_writes_a_tilde_output_under_home(tmp_path, monkeypatch):
    """``--output=~/p.json`` (the shell leaves ``~`` there): the profile is written under
    $HOME, as the argument's check reads it, not into a folder named ``~`` here."""
    from cupycoll._arguments import output_file
    from cupycoll.tuner.profile import default_profile, load_profile, save_profile

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    path = save_profile(default_profile(2), output_file("~/p.json"))
    assert path == tmp_path / "home" / "p.json" and path.is_file()
    assert not (tmp_path / "~").exists()
    assert load_profile("~/p.json", 2) == load_profile(path, 2)
