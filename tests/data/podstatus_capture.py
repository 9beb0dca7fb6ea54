# Regenerates podstatus_golden.json (only ever from code whose output is known good):
#   PYTHONPATH=$PWD python3 tests/data/podstatus_capture.py > tests/data/podstatus_golden.json
import json, time, sys
sys.path.insert(0, ".")  # the worktree root
time.time = lambda: 1_790_000_100.0
from tests.podstatus_scenarios import SCENARIOS
out = {name: build().get("u1") for name, build in SCENARIOS.items()}
for name, s in out.items():
    out[name] = json.loads(json.dumps(s))
print(json.dumps(out, sort_keys=True, indent=1))
