# Entry points shared by developers, CI (.ci/run) and the README.
# PYTHON: the interpreter the project is installed in (`make install`).
PYTHON ?= python3

# NODEAGENT_RUNTIME: the containerd devenv runs (`make test`, `make demo`, `make env`):
# containerd2 (default; 2.x built from the Go module proxy) or containerd1.6 (Debian's).
.PHONY: test lint deps deps-all env down status install demo

# The whole suite; the `containerd` fixture starts its own private containerd (and the
# control_plane fixture its own control plane) per worker. `deps` first, so that a fresh clone
# needs nothing before it. TEST_WORKERS pytest-xdist workers take whole files (a module's
# fixtures are set up once): the tests mostly wait on runtimes and servers, so two workers on
# two cores halve the suite's time (39 -> 20 min warm). TEST_WORKERS=0 runs in one process.
# The tests marked `serial` (a synthetic load of their own on the agent, or fixed ports) run alone afterwards,
# so that two loads never add up; both runs must pass. Every test that took 10 s or more is
# listed at the end of each: where the CI budget goes.
TEST_WORKERS ?= 2
test: deps
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial" --durations=0 --durations-min=10 tests
	$(PYTHON) -m pytest -q -m serial --durations=0 --durations-min=10 tests

# ruff (pyproject's [tool.ruff]) on everything, mypy --strict on the core and the CRI client.
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

# What most of the suite needs, each step skipped when already done: the Debian packages, the
# project with its test extra and the out-of-tree example stage (pip, only when one of
# them is not installed), containerd 2.x and the control plane, built from the Go module proxy
# into ~/.cache/nodeagent: minutes cold, a second warm. What only a file or two needs (e2e.test,
# agnhost, the CSI tools, kubeadm, metrics-server) those tests build when it is missing, under
# the cache's lock: on a fresh machine the build then overlaps the other worker's tests.
# `make deps-all` builds those too (before a long run or a demo of them).
DISTRIBUTIONS = nodeagent pytest pytest-xdist grpcio-tools prometheus_client hypothesis ruff mypy nodeagent-required-label \
	nodeagent-node-env
deps:
	$(PYTHON) devenv/packages.py
	@$(PYTHON) -c 'import importlib.metadata as m, sys; [m.distribution(d) for d in sys.argv[1:]]' \
		$(DISTRIBUTIONS) 2>/dev/null || $(MAKE) --no-print-directory install
	$(PYTHON) -m devenv runtime build
	$(PYTHON) -m controlplane build

deps-all: deps
	$(PYTHON) -m controlplane build e2e.test agnhost nonewprivs
	$(PYTHON) -m controlplane build csi-mock csi-sanity csi-attacher kubeadm
	$(PYTHON) -m controlplane.metricsserver

# A long-lived environment at /tmp/nodeagent-devenv; prints its CRI endpoint.
env:
	$(PYTHON) -m devenv up

down:
	$(PYTHON) -m devenv down

status:
	$(PYTHON) -m devenv status

# The project with its test extra, and the out-of-tree example stages (tests prove they join
# a real run without touching nodeagent/): required-label (admission), node-env (docs/PLUGINS.md's
# walkthrough: container additions).
install:
	$(PYTHON) -m pip install -q -e '.[test]'
	$(PYTHON) -m pip install -q -e examples/required-label
	$(PYTHON) -m pip install -q -e examples/node-env

# README's main command: a private containerd plus nodeagent running examples/pods.
demo:
	$(PYTHON) -m pip install -q -e '.[test]'
	$(PYTHON) examples/demo.py $(if $(DEMO_SECONDS),--seconds $(DEMO_SECONDS),)

# Regenerate cri/_generated from cri/proto/runtime/v1/api.proto (needs the test extra:
# grpcio-tools); tests/test_cri_codegen.py fails while the committed code is stale.
.PHONY: proto
proto:
	$(PYTHON) -m cri.codegen

# The 64-GPU gang end to end (issue 20): a control plane with gang scheduling, 8 nodeagents each
# with its own containerd and 8 fake GPUs, the scheduler placing a Workload/PodGroup gang of 8
# pods of 8 GPUs each; prints the figures (benchmarks/gang_e2e.py). GANG_ARGS to change it.
.PHONY: gang-demo
GANG_ARGS ?= --nodes 8 --gpus 8 --runs 1
gang-demo:
	$(PYTHON) -m benchmarks.gang $(GANG_ARGS)
