# Entry points shared by developers, CI (.ci/run) and the README.
# PYTHON: the interpreter the project is installed in (`make install`).
PYTHON ?= python3

.PHONY: test env down status install demo

# The whole suite; the `containerd` fixture starts its own private containerd.
test:
	$(PYTHON) -m pytest -q tests

# A long-lived environment at /tmp/nodeagent-devenv; prints its CRI endpoint.
env:
	$(PYTHON) -m devenv up

down:
	$(PYTHON) -m devenv down

status:
	$(PYTHON) -m devenv status

install:
	$(PYTHON) -m pip install -e '.[test]'

# README's main command: a private containerd plus nodeagent running examples/pods.
demo:
	$(PYTHON) -m pip install -q -e '.[test]'
	$(PYTHON) examples/demo.py $(if $(DEMO_SECONDS),--seconds $(DEMO_SECONDS),)

# Regenerate cri/_generated from cri/proto/runtime/v1/api.proto (needs the test extra:
# grpcio-tools); tests/test_cri_codegen.py fails while the committed code is stale.
.PHONY: proto
proto:
	$(PYTHON) -m cri.codegen
