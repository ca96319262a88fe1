# Two commands from a fresh clone:  `make run` (install + serve on the embedded defaults)
# and `make test` (install + lint + types + the whole test suite, end-to-end included).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install run test lint unit e2e controlplane promtool bench bench-quick audit

# wrk (Debian) is the load generator of `make bench` and tests/bench; root installs it.
install: $(VENV)/.installed
	@command -v wrk >/dev/null || (apt-get update -q && apt-get install -y -q wrk) \
		|| echo "wrk is not installed: make bench and tests/bench need it (apt-get install wrk)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

run: install
	$(BIN)/gpu-webhook serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The real kube-apiserver, etcd and kubectl for tests/e2e, built from the Go module
# proxy and cached outside the tree (first build 10-25 min, then seconds).
controlplane:
	bash tests/e2e/controlplane/build.sh

# promtool, for `promtool test rules` on deploy/monitoring (tests/metrics), built from
# the Go module proxy and cached outside the tree (first build a few minutes).
promtool:
	bash tools/promtool.sh

# The fast suite: no API server, no install or benchmark runs (marked slow).
unit: install
	$(BIN)/pytest -m "not e2e and not slow"

e2e: install controlplane
	$(BIN)/pytest -m e2e

# Known vulnerabilities in the installed dependencies (pip-audit). Skips, saying so,
# where no vulnerability service is reachable; fails on a known vulnerability.
audit: install
	$(BIN)/python tools/audit.py

test: lint audit controlplane promtool
	$(BIN)/pytest

# Benchmark: the served webhook vs a bare ASGI app over HTTPS, plus in-process costs
# (bench/README.md). About 9 minutes; bench-quick is a smoke run of every part (~45 s).
bench: install
	$(BIN)/python -m bench.run

bench-quick: install
	$(BIN)/python -m bench.run --quick
