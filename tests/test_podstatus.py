"""The typed pod status (nodeagent/podstatus.py) writes the JSON the dict-based code wrote.

tests/data/podstatus_golden.json was captured from the status stage and the status writer
before the status became a model (commit ed8cd9d); the same scenarios
(tests/podstatus_scenarios.py) must give byte-for-byte the same JSON, as the file sink writes it,
and nothing absent then may appear now.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.podstatus import ContainerState, ContainerStatus, PodStatus
from tests.podstatus_scenarios import SCENARIOS

GOLDEN = json.loads((Path(__file__).parent / "data" / "podstatus_golden.json").read_text())
CAPTURED_AT = 1_790_000_100.0
"""time.time() while the golden file was captured (tests/data/podstatus_capture.py)."""


def _file_json(status: Any) -> str:
    return json.dumps(status, sort_keys=True, separators=(",", ":"))  # as FileSink writes it


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_typed_status_writes_what_the_dict_status_wrote(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: CAPTURED_AT)
    status = SCENARIOS[name]().get("u1")
    assert _file_json(status) == _file_json(GOLDEN[name])


def test_the_scenarios_cover_what_the_agent_writes() -> None:
    # The golden file holds every field the agent sets, so a field the model drops or renames
    # shows up above.
    rich = GOLDEN["rich"]
    keys = set(rich) | set(GOLDEN["resizing"])
    assert {"initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses", "hostIPs", "podIPs",
            "qosClass", "startTime", "observedGeneration", "allocatedResources", "resources"} <= keys
    crash = next(cs for cs in rich["containerStatuses"] if cs["name"] == "crash")
    assert "waiting" in crash["state"] and "terminated" in crash["lastState"]
    assert any("observedGeneration" in c for c in GOLDEN["resizing"]["conditions"])
    assert GOLDEN["rejected"]["message"].startswith("Pod was rejected: ")


def test_unset_fields_stay_off_the_wire_and_required_ones_are_written_empty() -> None:
    cs = ContainerStatus(name="c", image="i", image_id="", ready=False, restart_count=0,
                         state=ContainerState(), last_state=ContainerState())
    assert PodStatus(phase="Pending", container_statuses=[cs]).to_api() == {
        "phase": "Pending",
        "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
                               "state": {}, "lastState": {}}],
    }
    # The API's names, initialisms included, read back into the same model.
    wire = {"hostIP": "h", "hostIPs": [{"ip": "h"}], "podIP": "p", "podIPs": [{"ip": "p"}],
            "containerStatuses": [{**PodStatus(container_statuses=[cs]).to_api()["containerStatuses"][0],
                                   "containerID": "containerd://x"}]}
    assert PodStatus.model_validate(wire).to_api() == wire


def test_a_copy_with_a_misspelt_field_raises() -> None:
    # The writer refines statuses with model_copy(update=...), which pydantic does not check.
    with pytest.raises(TypeError, match="has no field hostIp"):
        PodStatus().model_copy(update={"hostIp": "10.0.0.1"})
