"""The kubelet's pod semantics that several stages share, as plain functions over the pod
model: environment variables and ``$(VAR)`` expansion (env), resource requests, limits, QoS and
their cgroup values (resources), restart rules (restartpolicy), node fit at admission
(nodefit, nodeaffinity, nodeports), taint toleration (taints).

A library, not a stage: stages import it so that no stage imports another stage's module and
two stages can never disagree about what the kubelet's rules say.
"""
