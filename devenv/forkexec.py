"""gRPC's fork handlers off in every process the test environment runs, as in the agent
(nodeagent/__init__.py says why): imported first by devenv/__init__.py, before gRPC loads."""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
