"""The example notebooks execute headless, each on its own ipyparallel cluster of MPI engines."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import cupycoll.jupyter
from cupycoll.errors import InvalidArgument, InvalidType

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.ranks(4)  # the notebooks' engines
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path, monkeypatch):
    """Every cell runs without error (the notebooks assert their own results against dense
    references) and shows its figure inline, writing no file; the engines import this
    checkout's cupycoll."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # its own cluster files
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = [o for cell in notebook.cells for o in cell.get("outputs", ())
             if "image/png" in o.get("data", {})]
    assert shown, "the notebook showed no figure"
    assert not [p for p in tmp_path.iterdir() if p.name != "ipython"], "it left files behind"


def test_mpi_cluster_uses_this_pythons_mpiexec():
    cluster = cupycoll.jupyter.mpi_cluster(3, mpi_args=["-bind-to", "none"])
    assert cluster.n == 3
    assert cluster.config.MPILauncher.mpi_cmd == [cupycoll.jupyter.find_mpiexec()]
    assert cluster.config.MPILauncher.mpi_args == ["-bind-to", "none"]
    one_string = cupycoll.jupyter.mpi_cluster(2, mpi_args="-bind-to none -env A 'b c'")
    assert one_string.config.MPILauncher.mpi_args == ["-bind-to", "none", "-env", "A", "b c"]
    from traitlets.config import Config

    mine = Config()
    mine.Cluster.controller_ip = "127.0.0.1"
    mine.MPILauncher.mpi_cmd = ["elsewhere"]  # the launcher's own setting wins
    merged = cupycoll.jupyter.mpi_cluster(2, config=mine)
    assert merged.config.Cluster.controller_ip == "127.0.0.1"
    assert merged.config.MPILauncher.mpi_cmd == [cupycoll.jupyter.find_mpiexec()]
    with pytest.raises(InvalidArgument, match="'engines'.*mpi_cluster sets"):
        cupycoll.jupyter.mpi_cluster(2, engines="local")


@pytest.mark.parametrize("bad", [5, ["-n", 2], b"-bind-to"])
def test_mpi_cluster_rejects_bad_mpi_args(bad):
    with pytest.raises(InvalidType, match="'mpi_args'"):
        cupycoll.jupyter.mpi_cluster(2, mpi_args=bad)


def test_mpi_cluster_rejects_unsplittable_mpi_args_and_a_config_of_another_type():
    with pytest.raises(InvalidArgument, match="'mpi_args': a shell would not split it"):
        cupycoll.jupyter.mpi_cluster(2, mpi_args="-genv 'FOO")
    with pytest.raises(InvalidType, match="'config' must be a traitlets Config, a dict or None"):
        cupycoll.jupyter.mpi_cluster(2, config=5)
    as_dict = cupycoll.jupyter.mpi_cluster(2, config={"Cluster": {"controller_ip": "127.0.0.1"}})
    assert as_dict.config.Cluster.controller_ip == "127.0.0.1"


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_mpi_cluster_rejects_bad_engine_counts(bad):
    with pytest.raises(InvalidArgument, match="invalid argument 'n'"):
        cupycoll.jupyter.mpi_cluster(bad)
