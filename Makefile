# Two entry points do all setup on a fresh machine: `make demo` and `make test`.
# Both create .venv and install what they need (apt packages for the tests included).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Debian packages the integration tests use: real Prometheus, real JMeter (with its HTTP sampler),
# a Docker engine and debootstrap (local base images and the systemd target, since no registry is reachable),
# cloud-init tools (schema checks, NoCloud seeds), QEMU and libvirtd (the real guest), the headers
# libvirt-python builds against, and an OpenSSH server (the pipeline's fabric steps against a real sshd).
APT_PACKAGES ?= prometheus jmeter jmeter-http docker.io debootstrap cloud-init cloud-image-utils qemu-utils \
	qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu pkg-config libvirt-dev openssh-server chromium
DEMO_OUT ?= out/demo
PYTEST_ARGS ?=
# The test modules run on two pytest-xdist workers, one module per worker at a time, the heavy ones first
# (tests/conftest.py): 22 to 37 min on 2 cores, against 64 in one process. PYTEST_JOBS=0 runs them in one process.
PYTEST_JOBS ?= 2
# Where torch's CPU wheel comes from (empty: pip's configured indexes), e.g. https://download.pytorch.org/whl/cpu.
TORCH_INDEX_URL ?=

.PHONY: all demo test venv apt clean bench help

help:
	@echo "make demo   - benchmark the shipped DQN and the default policy set on the standard suite (embedded twin) and write $(DEMO_OUT)/report.html"
	@echo "make test   - install what the tests need and run them"
	@echo "make bench  - run the benchmarks in bench/ (results go to docs/PERFORMANCE.md by hand)"

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "joulesched needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch 2.13.0 goes first, so that what comes after keeps it. Which build comes is the index's: the CPU one from
	# this environment's indexes; where pip reads PyPI (whose Linux wheels are CUDA builds) TORCH_INDEX_URL names
	# PyTorch's CPU index (README, first paragraph).
	$(BIN)/pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/pip install --quiet -e '.[test,load,sweep,infra,infra-aws,node-power,autoscaler]'
	touch $@

# libvirt-python compiles against libvirt-dev, so it comes after the apt step; without it the libvirt tests skip.
$(BIN)/.installed-libvirt: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[infra-libvirt]' || echo "libvirt-python did not build; libvirt tests will skip"
	touch $@

apt:
	@scripts/apt-deps.sh $(APT_PACKAGES)

demo: venv
	$(BIN)/joulesched demo --out $(DEMO_OUT)

test: venv apt
	$(MAKE) $(BIN)/.installed-libvirt
	# The architecture first: layers, no cycles, test kits out of the product (pyproject.toml).
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: venv
	$(BIN)/python bench/twin_throughput.py
	$(BIN)/python bench/decision_latency.py
	$(BIN)/python bench/live_latency.py

clean:
	rm -rf $(VENV) out .pytest_cache
