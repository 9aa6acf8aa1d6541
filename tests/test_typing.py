"""The public API's signatures reach type checkers: mypy flags wrong calls to attnlab.train,
attnlab.load and the SAE functions, and the package is marked typed (py.typed)."""

import subprocess
import sys
from pathlib import Path

import pytest

import attnlab

ROOT = Path(__file__).resolve().parents[1]

WRONG = """
import attnlab
from pathlib import Path

run = attnlab.train(3)
folder: int = run.out
attnlab.load("runs/x", device=5)
attnlab.sae.train("runs/x", hook=1)
cb: attnlab.Callback = attnlab.EarlyStopping(patience="2")
"""


@pytest.mark.slow
def test_type_checkers_see_the_real_signatures(tmp_path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "use.py"
    snippet.write_text(WRONG)
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(snippet)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    out = r.stdout
    assert 'Argument 1 to "train" has incompatible type "int"; expected "str | DataclassInstance"' in out, out
    assert 'expression has type "Path", variable has type "int"' in out, out
    assert 'Argument "device" to "load" has incompatible type "int"' in out, out
    assert 'Argument "hook" to "train" has incompatible type "int"' in out, out
    assert 'Argument "patience" to "EarlyStopping" has incompatible type "str"' in out, out
    assert out.count("error:") == 5, out


def test_the_package_is_typed_and_help_shows_real_signatures():
    assert (Path(attnlab.__file__).parent / "py.typed").is_file()
    import inspect

    assert list(inspect.signature(attnlab.train).parameters)[:6] == [
        "family",
        "data",
        "out",
        "resume",
        "config",
        "callbacks",
    ]
    assert inspect.signature(attnlab.load).parameters["device"].default is None
    assert attnlab.train.__module__ == "attnlab.api" and attnlab.load.__doc__.startswith("A ready model")
