# gtrain developer commands. `make demo` and `make test` work on a fresh machine (they set up .venv first).
PY     ?= .venv/bin/python
PIP    ?= .venv/bin/pip
STAMP  := .venv/.gtrain-setup
DEMO   := .venv/.gtrain-demo

.PHONY: setup deps demo test test-unit test-integration bench lint clean

# the demo's environment: gtrain and what the local provider trains with, nothing of the test toolchain
$(DEMO): pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# torch: the CPU wheel of this exact version (a plain `torch` would pull a multi-GB CUDA build)
	$(PIP) install -q torch==2.13.0 numpy
	$(PIP) install -q -e '.[train]'
	touch $(DEMO)

# everything the tests and the linters need, on top of the demo's
$(STAMP): $(DEMO)
	$(PIP) install -q -e '.[dev,test]'
	touch $(STAMP)

setup: $(STAMP)

# the system programs the tests need (sshd, rsync, iproute2, procps): instant when present; as root it
# apt-installs what is missing, otherwise it stops here with the one command to run
deps:
	@.ci/install-deps

demo: $(DEMO)
	$(PY) -m gtrain run examples/quickstart/spec.yaml --to quickstart-checkpoints

test: deps setup
	$(PY) -m pytest -q --durations=40

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-integration: deps setup
	$(PY) -m pytest -q tests/integration

bench: setup
	bash bench/run_all.sh

lint: setup
	$(PY) -m ruff check gtrain tests bench
	$(PY) -m mypy
	.venv/bin/lint-imports

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache quickstart-checkpoints quickstart-report.html
