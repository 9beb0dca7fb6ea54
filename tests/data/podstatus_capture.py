"""Regenerates podstatus_golden.json, only ever from code whose output is known good:

    PYTHONPATH=$PWD python3 tests/data/podstatus_capture.py > tests/data/podstatus_golden.json
"""

import json
import sys
import time

sys.path.insert(0, ".")  # the worktree root
time.time = lambda: 1_790_000_100.0  # tests/test_podstatus.py's CAPTURED_AT

from tests.podstatus_scenarios import SCENARIOS  # noqa: E402 - after the clock is fixed

statuses = {name: json.loads(json.dumps(build().get("u1"))) for name, build in SCENARIOS.items()}
print(json.dumps(statuses, sort_keys=True, indent=1))
