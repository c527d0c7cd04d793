"""The documentation is true: marked code blocks run, and every relative link points to a file.

A Python block runs when the line before its fence is ``<!-- runnable -->`` (one process) or
``<!-- runnable: mpiexec -n P -->`` (P ranks, ``python -m mpi4py``, with a timeout).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._mpi import ROOT, mpiexec

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!-- runnable(?::\s*mpiexec -n (\d+))? -->\n```python\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def blocks():
    for page in PAGES:
        for number, match in enumerate(MARK.finditer(page.read_text()), 1):
            nprocs = int(match.group(1) or 0)
            yield pytest.param(match.group(2), nprocs, id=f"{page.name}-{number}")


def test_pages_exist_and_readme_is_a_front_door():
    assert all(page.exists() for page in PAGES)
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_there_are_runnable_blocks():
    assert len(list(blocks())) >= 3


@pytest.mark.parametrize("code,nprocs", list(blocks()))
def test_block_runs(code, nprocs, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    cmd = [sys.executable, str(script)]
    if nprocs:
        cmd = [mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env, start_new_session=True)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_to_files(page):
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_setting_is_in_the_configuration_table():
    from cupycoll._config import SETTINGS

    table = (ROOT / "docs" / "configuration.md").read_text()
    for name in SETTINGS:
        assert f"| `{name}` |" in table, f"{name} missing from docs/configuration.md"


INSTALL = re.compile(r"pip install '[^'\[]*\[([^\]]+)\]'")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_gpu_installs_bring_an_mpi(page):
    """The GPU extras carry no MPI library: an install line naming one also names an extra that
    brings mpich (``mpi``, ``test`` or ``notebook``), so ``mpiexec`` exists afterwards."""
    for extras in INSTALL.findall(page.read_text()):
        names = set(extras.split(","))
        if any(n.startswith("gpu-") for n in names):
            assert names & {"mpi", "test", "notebook"}, f"{page.name}: [{extras}] has no MPI"
