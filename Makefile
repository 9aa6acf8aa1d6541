# Two commands set everything up on a fresh machine:
#   make demo   - create .venv, install attnlab, train a small GPT on the embedded corpus and sample
#   make test   - create .venv with the test extras and run the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# torch is pinned first: pip takes the CPU build from local disk; an open range could pull a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test venv bench clean

# .installed-<extra>: the venv with attnlab and that extra (vision, seq2seq, hf, all, test)
$(VENV)/.installed-%: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[$*]"
	touch $@

venv: $(VENV)/.installed-all

demo: $(VENV)/.installed-all
	@if [ -d runs/demo/last ]; then echo "runs/demo already trained: sampling from it (rm -rf runs/demo to train again)"; \
	else $(VENV)/bin/attnlab train gpt --out runs/demo; fi
	$(VENV)/bin/attnlab sample --ckpt runs/demo --prompt "The " --max-new-tokens 300

test: $(VENV)/.installed-test
	$(PY) -m pytest

bench: $(VENV)/.installed-test
	$(VENV)/bin/attnlab bench --quick

clean:
	rm -rf $(VENV) runs *.egg-info
