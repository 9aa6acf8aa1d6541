"""Every notebook (notebooks/*.py, jupytext percent format) runs top to bottom in a fresh kernel,
tiny (ATTNLAB_QUICK=1), and fails on any error; it uses only the public Python API."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (each notebook runs top to bottom: tens of seconds)

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.py"))


def test_there_is_a_notebook_per_lecture_topic():
    assert len(NOTEBOOKS) >= 6, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # the public API only: no private names from attnlab
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnlab"):
            assert not any(a.name.startswith("_") for a in node.names), f"{path.name} imports a private name"
    monkeypatch.setenv("ATTNLAB_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    images = [o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, f"{path.name} shows no figure"
