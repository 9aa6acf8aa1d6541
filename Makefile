# Two commands set everything up on a fresh machine:
#   make demo   - create .venv, install attnlab (no extra), train a small GPT on the embedded corpus and sample
#   make test   - create .venv with the test extras; lint, run the whole test suite (the notebooks too),
#                 build the docs strictly and check the wheel installs and runs outside the source tree
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# torch is pinned first: pip takes the CPU build from local disk; an open range could pull a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test venv bench clean chromium docs notebooks wheel-check

# .installed-<extra>: the venv with attnlab and that extra (vision, seq2seq, hf, all, test)
$(VENV)/.installed-%: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[$*]" $(TORCH)  # (pinned again: an extra must not pull another torch)
	touch $@

# .installed-core: attnlab alone (what the demo needs: no extra)
$(VENV)/.installed-core: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e . $(TORCH)
	touch $@

venv: $(VENV)/.installed-all

demo: $(VENV)/.installed-core
	@if [ -d runs/demo/last ]; then echo "runs/demo already trained: sampling from it (rm -rf runs/demo to train again)"; \
	else $(VENV)/bin/attnlab train gpt --out runs/demo --sample-chars 0 --max-iters 900; fi
	@echo "--- a sample (temperature 0.6: a one-minute model keeps to the words it has learned) ---"
	$(VENV)/bin/attnlab sample --ckpt runs/demo --prompt "The " --max-new-tokens 400 --temperature 0.6 --seed 1
	@echo "--- a one-minute character-level model: it has learned the corpus's spelling and its common words, not"
	@echo "    what they mean. Next: source .venv/bin/activate, then the first hour in README.md ---"

# the explorer's browser tests need Chromium: installed from Debian when missing and run as root
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || \
	   (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null)); } || \
	echo "note: no Chromium; the explorer's browser tests will fail until 'apt-get install chromium' (as root)"

test: $(VENV)/.installed-test chromium
	$(VENV)/bin/ruff check attnlab tests benchmarks notebooks
	$(VENV)/bin/ruff format --check attnlab tests benchmarks notebooks
	$(VENV)/bin/mypy
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile  # (a worker per core, up to 4; a file's tests in one: they share its fixtures)
	$(MAKE) docs wheel-check

# the documentation site: README, docs/, the benchmarks, the command and API references (site/)
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# the notebooks as .ipynb beside their jupytext .py sources, each run top to bottom (outputs inline;
# QUICK=1: the tiny size the tests use); then: .venv/bin/jupyter lab notebooks/
notebooks: $(VENV)/.installed-notebooks
	cd notebooks && ATTNLAB_QUICK=$(if $(QUICK),1,0) MPLBACKEND=module://matplotlib_inline.backend_inline \
	  ../$(VENV)/bin/jupytext --quiet --to ipynb --execute *.py

# the wheel and sdist, installed into a fresh venv outside the source tree and used from there
wheel-check: $(VENV)/.installed-test
	PY=$(PY) PYTHON=$(PYTHON) TORCH=$(TORCH) bash scripts/check_wheel.sh

bench: $(VENV)/.installed-test
	$(VENV)/bin/attnlab bench --quick

clean:
	rm -rf $(VENV) runs *.egg-info site notebooks/*.ipynb
