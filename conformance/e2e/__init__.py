"""The upstream Kubernetes e2e tests ([NodeConformance] and the one-node
[Conformance] tests of test/e2e/common and test/e2e/storage) run against nodeagent as a cluster's
node. `python -m conformance.e2e run`; see README.md in this folder."""
