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

# Placeholder until the demo exists: brings the environment up.
demo:
	$(PYTHON) -m devenv up
