"""Kubernetes' node e2e suite (k8s.io/kubernetes test/e2e_node) with nodeagent as the node under
test: `python -m conformance.node_e2e run`. docs/node-e2e.md says how the harness works and what
cannot run here."""
