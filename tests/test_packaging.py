"""The built wheel ships the CUDA kernels, the benchmarks, the typing marker, every subpackage and
a working ``cupycoll`` command; the sdist ships the tests, docs and examples too; the source tree
keeps its layout rules (module size, imports)."""

import ast
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True, timeout=300, cwd=out)
    return next(out.glob("cupycoll-*.whl"))


def test_wheel_ships_kernels_and_benchmarks(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.name for p in (ROOT / "kernels").glob("*.cu"))
    benches = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert kernels and benches
    for name in kernels:
        assert f"cupycoll/kernels/{name}" in names, f"{name} missing from the wheel"
    for name in benches:
        assert f"cupycoll/bench/{name}" in names, f"{name} missing from the wheel"
    assert not [n for n in names if n.startswith("cupycoll/bench/dev/")]  # developer probes
    for module in ("cupycoll/__init__.py", "cupycoll/py.typed", "cupycoll/comm/mpi.py",
                   "cupycoll/comm/nccl.py", "cupycoll/sparse/__init__.py",
                   "cupycoll/topk/__init__.py", "cupycoll/primitives/__init__.py",
                   "cupycoll/__main__.py", "cupycoll/jupyter.py",
                   "cupycoll/testing/emulation/nccl.py", "cupycoll/kernels/cpu_shim.h",
                   "cupycoll/wire/__init__.py", "cupycoll/wire/_cupy.py"):
        assert module in names, f"{module} missing from the wheel"


def test_wheel_ships_the_license_and_no_sdist_extras(wheel):
    """The wheel carries LICENSE in its metadata, and MANIFEST.in's grafts stay out of it."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "cupycoll-0.1.0.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith(("cupycoll/bench/figures/", "tests/", "docs/"))]


def _shipped(folder: str) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            and not p.is_relative_to(ROOT / "bench" / "results")}


def test_sdist_ships_tests_docs_examples_and_license(tmp_path):
    """The sdist is a whole source tree: the test suite with its helpers, the docs, the examples,
    every benchmark, the changelog and the license (MANIFEST.in)."""
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300,
                         capture_output=True, text=True).stdout.split()[-1]
    with tarfile.open(tmp_path / out) as tar:
        names = {n.partition("/")[2] for n in tar.getnames()}
    want = {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "tests/conftest.py",
            "tests/_mpi.py", "tests/workers/__init__.py", "tests/mutation/run.py"}
    for folder in ("tests", "docs", "examples", "bench", "kernels"):
        want |= _shipped(folder)
    assert not want - names, f"missing from the sdist: {sorted(want - names)}"


def test_installed_command_runs_info_and_a_benchmark(wheel, tmp_path):
    """pip install the wheel into a fresh target (dependencies from this environment): the
    console script works outside the source tree, reports the installed version, and runs a
    shipped benchmark."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    command = str(target / "bin" / "cupycoll")
    info = subprocess.run([command, "info"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env, check=True).stdout
    version = next(line for line in info.splitlines() if line.startswith("cupycoll "))
    assert "0.1.0" in version and str(target) in version, version
    bench = subprocess.run([command, "bench", "dense", "-b", "8", "-e", "64", "-n", "2", "-w",
                            "1", "--no-progress"], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path, env=env)
    assert bench.returncode == 0, bench.stderr
    rows = [r for r in bench.stdout.splitlines() if r.strip() and not r.startswith("#")]
    assert len(rows) == 4 and all(r.split()[-1] == "0" for r in rows), bench.stdout


# ------------------------------------------------------------------------------------------
# layout: module size and import order
# ------------------------------------------------------------------------------------------

PACKAGE = ROOT / "cupycoll"
#: the most lines a module may have (the style rule is ~400; this is the hard stop).
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """The cupycoll modules ``path`` imports, at module level or inside functions (lazily), but
    not under ``if TYPE_CHECKING``. ``from P import name`` counts P unless name is a submodule."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("cupycoll"))
            elif isinstance(child, ast.ImportFrom):
                target = child.module or ""
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    target = f"{base}.{child.module}" if child.module else base
                if target.startswith("cupycoll"):
                    subs = {f"{target}.{a.name}" for a in child.names
                            if _is_module(f"{target}.{a.name}")}
                    found.update(subs if len(subs) == len(child.names) else subs | {target})
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {name}


def _cycles(package: str) -> list[list[str]]:
    """Import cycles among the modules of ``package`` (its ``__init__`` included)."""
    graph = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    nodes = {n for n in graph if n == package or n.startswith(package + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node] & nodes):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(nodes):
        if node not in state:
            walk(node, [])
    return cycles


def test_no_module_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"


#: every package of cupycoll, and cupycoll as a whole (cycles across packages)
PACKAGES = ["cupycoll"] + sorted(
    _module_name(p) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    """Imports flow one way: leaves <- implementations <- the package ``__init__`` (which no
    submodule imports), lazy imports included, within every package and across them."""
    assert _cycles(package) == []


def test_import_graph_sees_a_cycle(tmp_path, monkeypatch):
    """The cycle check itself: a submodule importing its package's ``__init__`` is a cycle."""
    pkg = tmp_path / "cupycoll" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ._leaf import f\n")
    (pkg / "_leaf.py").write_text("def f():\n    from . import g\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "cupycoll")
    assert _cycles("cupycoll.demo") == [["cupycoll.demo", "cupycoll.demo._leaf", "cupycoll.demo"]]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_module_imports_first_in_a_fresh_interpreter(seed):
    """Import every cupycoll module in a shuffled order in a new process: whichever comes first
    must import on its own (no order-dependent, half-initialised circle)."""
    code = ("import importlib, pathlib, random, sys\n"
            "root = pathlib.Path('cupycoll')\n"
            "names = sorted('.'.join(p.with_suffix('').parts).removesuffix('.__init__')\n"
            "               for p in root.rglob('*.py') if p.name != '__main__.py')\n"
            f"random.Random({seed}).shuffle(names)\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "print(len(names))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 50


def test_import_leaves_the_optional_and_heavy_modules_unimported():
    """``import cupycoll`` imports no tuner, testing tools, numba, torch, CuPy or
    ``importlib.metadata`` (``__version__`` reads the metadata on first use)."""
    code = (
        "import sys, cupycoll\n"
        "unwanted = ('importlib.metadata', 'numba', 'cupycoll.tuner', 'cupycoll.testing',"
        " 'torch', 'cupy')\n"
        "assert not [m for m in unwanted if m in sys.modules], [m for m in unwanted"
        " if m in sys.modules]\n"
        "from importlib import metadata\n"
        "try:\n"
        "    want = metadata.version('cupycoll')\n"
        "except metadata.PackageNotFoundError:\n"
        "    want = '0+unknown'\n"
        "assert cupycoll.__version__ == want, (cupycoll.__version__, want)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)
