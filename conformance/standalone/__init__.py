"""The standalone conformance suite: upstream Kubernetes node-conformance tests ported to run
against one nodeagent and containerd, without an API server.

- :mod:`~conformance.standalone.registry`: the cases, each under its upstream full test name;
- :mod:`~conformance.standalone.framework`: what upstream's e2e framework gives a test (pod
  create/delete as static manifests, status, logs, exec, the ``e2epod`` waits);
- :mod:`~conformance.standalone.lifecycle_harness` and :mod:`~conformance.standalone.mounttest`:
  upstream's container-lifecycle harness and agnhost mounttest, in busybox shell;
- :mod:`~conformance.standalone.cases`: the ported tests, one module per upstream file;
- :mod:`~conformance.standalone.runner`: one agent, the cases run concurrently;
- :mod:`~conformance.standalone.report`: the table, JUnit XML, and docs/conformance-standalone.md.

Run it with ``python -m conformance standalone`` (see that module for the options).
"""
