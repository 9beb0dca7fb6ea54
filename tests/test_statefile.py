"""State written crash-safely (issue 13 §7): tmp + fsync + rename, private modes, and a damaged
or foreign file moved aside and reported, never fatal — for the status files, image pull
records and the DRA checkpoint."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from nodeagent.events import PodRef
from nodeagent.statefile import CORRUPT_SUFFIX, StateFileError, read_or_quarantine, write_atomic
from nodeagent.status import FileSink
from plugins.runtime.pullrecords import PullRecords

pytestmark = pytest.mark.anyio


def test_an_atomic_write_replaces_the_file_whole_with_a_private_mode(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    write_atomic(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"], "no temporary file is left"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    def full_disk(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def _json_object(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise StateFileError("not an object")
    return data


@pytest.mark.parametrize("content", [b"{\"half\": ", b"\x00\x00\x00", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_or_foreign_file_is_moved_aside_and_read_as_absent(tmp_path: Path, content: bytes) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(content)
    assert read_or_quarantine(target, _json_object, what="test state") is None
    assert not target.exists()
    [aside] = list(tmp_path.iterdir())
    assert aside.name.startswith("state.json" + CORRUPT_SUFFIX) and aside.read_bytes() == content
    assert read_or_quarantine(target, _json_object, what="test state") is None, "a missing file is simply absent"


def test_a_directory_where_a_state_file_should_be_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / "state.json").mkdir()
    assert read_or_quarantine(tmp_path / "state.json", _json_object, what="test state") is None
    assert not (tmp_path / "state.json").exists()


async def test_status_files_are_written_as_private_state(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "pod-status")
    ref = PodRef(uid="u1", namespace="ns", name="p")
    await sink.write(ref, {"phase": "Running"})
    path = sink.path(ref)
    assert json.loads(path.read_text())["status"] == {"phase": "Running"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "pod-status").stat().st_mode) == 0o750


async def test_a_damaged_pull_record_is_moved_aside_and_the_image_verified_again(tmp_path: Path) -> None:
    records = PullRecords(tmp_path / "image_manager", policy="AlwaysVerify")
    records.intend("registry.example/app:1")
    records.pulled("registry.example/app:1", "sha256:abc", None)

    async def no_credentials() -> list[Any]:
        return []

    assert not await records.must_pull("registry.example/app:1", "sha256:abc", no_credentials)
    [record] = list((tmp_path / "image_manager" / "pulled").iterdir())
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    record.write_text('{"credentialMapping": ')  # torn by something other than us
    assert await records.must_pull("registry.example/app:1", "sha256:abc", no_credentials)
    names = [p.name for p in (tmp_path / "image_manager" / "pulled").iterdir()]
    assert len(names) == 1 and CORRUPT_SUFFIX in names[0]
