#!/usr/bin/env bash
# Build the wheel and sdist, install the wheel into a fresh virtual environment outside the source
# tree, and use it: `attnlab --help`, `python -m attnlab`, a 20-step GPT, the explorer page.
# Called by `make test` (make wheel-check); PYTHON and TORCH as in the Makefile.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch==2.13.0}"
work="$(mktemp -d "${TMPDIR:-/tmp}/attnlab-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"$PY" -m build --sdist --wheel --outdir "$work/dist" . >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
wheel="$(ls "$work"/dist/attnlab-*.whl)"
ls "$work"/dist/attnlab-*.tar.gz >/dev/null
"$PYTHON" -m venv "$work/venv"
pip_install() { "$work/venv/bin/pip" install -q "$@" >>"$work/pip.log" 2>&1 || { tail -20 "$work/pip.log"; exit 1; }; }
pip_install "$TORCH"
pip_install "$wheel" "$TORCH"   # (pinned again: the wheel must not pull another torch)
cd "$work"   # outside the source tree: only the installed wheel can be imported
venv/bin/attnlab --help >/dev/null
venv/bin/attnlab train gpt --help | grep -q -- "--max-iters"   # (from the live declarations: no torch)
test -f "$(venv/bin/python -c 'import attnlab, pathlib; print(pathlib.Path(attnlab.__file__).with_name("py.typed"))')"
venv/bin/python -m attnlab --version
venv/bin/python -c "import attnlab, pathlib; assert 'site-packages' in attnlab.__file__, attnlab.__file__"
venv/bin/attnlab train gpt --out run --max-iters 20 --eval-interval 10 --eval-iters 2 --no-progress --sample-chars 0 \
    --device cpu >train.log 2>&1 || { tail -20 train.log; exit 1; }
venv/bin/attnlab explore --ckpt run --text "The attention" --out page.html
grep -q "attnlab explorer" page.html
echo "wheel check: $(basename "$wheel") installs and runs outside the source tree"
