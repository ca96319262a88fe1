# Two commands from a fresh clone:  `make run` (install what `serve` needs, then serve on the
# embedded defaults) and `make test` (install + lint + types + the whole test suite, end-to-end included).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install run test lint unit e2e controlplane promtool helm image-tools image bench bench-quick audit demo demo-down bench-scale bench-overload

# wrk (Debian) is the load generator of `make bench` and tests/bench; root installs it.
# A failed install fails `make install`: tests/bench cannot run without it.
install: $(VENV)/.installed
	@command -v wrk >/dev/null || (apt-get update -q && apt-get install -y -q wrk) \
		|| { echo "make install: wrk could not be installed; make bench and tests/bench" \
		          "need it: apt-get install wrk (as root)" >&2; exit 1; }

# What `serve` needs and nothing else (no test, lint, benchmark or plotting packages):
# `make run` stops here; everything else adds the dev and bench extras on top.
$(VENV)/.installed-serve: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-serve pyproject.toml
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

run: $(VENV)/.installed-serve
	$(BIN)/gpu-webhook serve

# The whole product on a simulated GPU cluster (real scheduler and controllers, kwok's
# GPU nodes): scripted workloads, a table of where each pod ran or why it was refused;
# the cluster stays up (kubeconfig printed) until `make demo-down`.
demo: install controlplane
	$(BIN)/python tools/demo.py

demo-down:
	$(BIN)/python tools/demo.py down

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The real kube-apiserver, etcd, kubectl, kube-scheduler, kube-controller-manager and
# kwok for tests/e2e, built from the Go module proxy and cached outside the tree (first
# build 10-25 min, then seconds).
controlplane:
	bash tests/e2e/controlplane/build.sh

# promtool, for `promtool test rules` on deploy/monitoring (tests/metrics), built from
# the Go module proxy and cached outside the tree (first build a few minutes).
promtool:
	bash tools/promtool.sh

# helm (v3), for the chart's tests (tests/deploy/test_helm_chart.py, tests/e2e/test_e2e_helm.py),
# built from the Go module proxy and cached outside the tree (first build a few minutes).
helm:
	bash tests/deploy/helm/build.sh

# A real GPU node's parts (kubelet, containerd, runc, NVIDIA's container toolkit and device
# plugin, CNI, images, the webhook's wheels), built from the Go module proxy and packed for
# a GPU host, where `tools/realnode/run.sh --bundles DIR` runs them with the webhook in
# front (docs/real-gpu-node.md). Not part of `make test`: CI has no GPU.
.PHONY: realnode
realnode:
	bash tools/realnode/build.sh

# podman, runc and mmdebstrap (Debian), for the image test (tests/e2e/test_e2e_image.py):
# the Dockerfile built on a Debian base made by mmdebstrap and run as the Deployment runs
# it. Root installs them; a failed install fails the target.
image-tools:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null \
		|| (apt-get update -q && apt-get install -y -q --no-install-recommends podman runc mmdebstrap) \
		|| { echo "make image-tools: podman, runc and mmdebstrap could not be installed;" \
		          "tests/e2e/test_e2e_image.py needs them: apt-get install podman runc mmdebstrap" \
		          "(as root)" >&2; exit 1; }

# The image, with whichever engine is here (docker or podman): IMAGE=registry/name:tag
# names it, BASE=... changes the base both stages start from (README.md, "Build your own image").
IMAGE ?= gpu-webhook:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ENGINE ?= $(shell command -v docker >/dev/null && echo docker || echo podman)
image:
	$(ENGINE) build $(if $(BASE),--build-arg BASE=$(BASE)) -t $(IMAGE) .

# The fast suite: no API server, no image, tour or benchmark runs (marked slow).
unit: install
	$(BIN)/pytest -m "not e2e and not slow"

e2e: install controlplane image-tools
	$(BIN)/pytest -m e2e

# Known vulnerabilities in the installed dependencies (pip-audit). Skips, saying so,
# where no vulnerability service is reachable; fails on a known vulnerability.
audit: install
	$(BIN)/python tools/audit.py

test: lint audit controlplane promtool helm image-tools
	$(BIN)/pytest

# Benchmark: the served webhook vs a bare ASGI app over HTTPS, plus in-process costs
# (bench/README.md). About 9 minutes, then bench/apiserver.py: pod creations through a real
# kube-apiserver with no webhook, a do-nothing one, ours and Kyverno (when tools/kyverno.sh
# has built it), ~15 minutes; bench-quick is a smoke run of every part (~2 min).
bench: install controlplane
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.apiserver

bench-quick: install controlplane
	$(BIN)/python -m bench.run --quick
	$(BIN)/python -m bench.apiserver --quick

# Creations past what the machine answers: what the webhook does at the edge (sheds,
# refuses what it cannot commit in time), ~1.5 minutes (bench/README.md).
bench-overload: install controlplane
	$(BIN)/python -m bench.overload

# Scale run on the simulated GPU cluster: 500 kwok GPU nodes, 20 tenants, 2 x 10,000 GPU
# pods through the Job controller with and without the webhook (about 25 minutes on 2
# cores; bench/README.md). Sizes are flags: $(BIN)/python -m bench.scale --help
bench-scale: install controlplane
	$(BIN)/python -m bench.scale
