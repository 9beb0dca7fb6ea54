"""nodeagent: a node agent that runs Kubernetes pods on a CRI runtime.

The core holds the bus, the phase contracts, the pod workers and the lifecycle; every
concern that touches pods (admission, the runtime, status, devices, gangs) is a stage plugin.
"""

__version__ = "0.1.0"
