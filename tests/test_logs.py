"""Container logs: the CRI log files, the legacy symlinks, rotation, and `nodeagent logs`.

End to end on the real containerd with busybox pods; the file-format and rotation helpers also
have quick unit tests at the end.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from nodeagent import logreader as lr
from nodeagent import registry
from plugins.logs import rotation, symlink
from tests.agent_helpers import (
    BUSYBOX_IMAGE,
    AgentEnv,
    pod_manifest,
    running_agent,
    wait_for,
)

pytestmark = pytest.mark.anyio

CRI_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([PF]) (.*)$")


@pytest.fixture(autouse=True)
def _logs_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until pyproject.toml registers `logs = "plugins.logs:plugin"` and the package is
    reinstalled, make the entry point visible to discovery (a no-op afterwards)."""
    if "logs" in registry.discover():
        return
    real = registry.entry_points
    extra = EntryPoint(name="logs", value="plugins.logs:plugin", group=registry.GROUP)

    def with_logs(**kwargs: Any) -> Any:
        found = list(real(**kwargs))
        return [*found, extra] if kwargs.get("group") == registry.GROUP else found

    monkeypatch.setattr(registry, "entry_points", with_logs)


def _settings(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    profile = {phase: list(names) for phase, names in registry.DEFAULT_PROFILE.items()}
    for phase in ("observe", "cleanup"):
        if "logs" not in profile[phase]:
            profile[phase].append("logs")
    return {"profile": profile, "container_logs_symlink_dir": tmp_path / "containers", **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _container_dir(env: AgentEnv, name: str, container: str = "main") -> Path:
    uid = env.uid_of(name)
    assert uid, f"no pod {name}"
    return env.config.pod_logs_dir / f"default_{name}-{env.node}_{uid}" / container


def _contents(path: Path) -> list[str]:
    try:
        return [line.content.decode() for line in lr.read(path)]
    except FileNotFoundError:
        return []


def _links(env: AgentEnv) -> dict[str, str]:
    directory = Path(env.config.plugins["logs"]["containerLogsSymlinkDir"])
    if not directory.exists():
        return {}
    return {n: os.readlink(directory / n) for n in os.listdir(directory)}


async def _cli(env: AgentEnv, port: int, *args: str) -> tuple[int, str, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "nodeagent", "logs", "--healthz-port", str(port),
         "--pod-logs-dir", str(env.config.pod_logs_dir), "--node-name", env.node, *args],
        check=False)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


class _Follower:
    """`nodeagent logs -f` as a subprocess, its output collected as it comes."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.output = b""

    async def collect(self) -> None:
        assert self.process.stdout is not None
        async for chunk in self.process.stdout:
            self.output += chunk

    async def wait_for(self, text: str, timeout: float = 30.0) -> None:
        async def seen() -> bool:
            return text in self.output.decode()

        await wait_for(seen, timeout, f"{text!r} in `logs -f` output")


@asynccontextmanager
async def _following(env: AgentEnv, port: int, *args: str) -> AsyncIterator[_Follower]:
    """Run `nodeagent logs -f ...`; it is killed on the way out, whatever happened."""
    process = await anyio.open_process(
        [sys.executable, "-m", "nodeagent", "logs", "-f", "--healthz-port", str(port),
         "--pod-logs-dir", str(env.config.pod_logs_dir), "--node-name", env.node, *args])
    follower = _Follower(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.collect)
            try:
                yield follower
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            await process.aclose()


# --- end to end ---------------------------------------------------------------------------


async def test_cri_log_file_and_legacy_symlink_live_and_die_with_the_pod(containerd: Any, tmp_path: Path) -> None:
    async with running_agent(containerd, tmp_path, **_settings(tmp_path)) as env:
        env.write("hello.yaml", pod_manifest("hello", "echo out-line; echo err-line >&2; exec sleep 3600"))
        container = await env.wait_running("hello")
        log = _container_dir(env, "hello") / "0.log"

        def records() -> list[tuple[str, str, str]]:
            try:
                lines = log.read_text().splitlines()
            except FileNotFoundError:
                return []
            found = [CRI_LINE.match(line) for line in lines]
            assert all(found), f"not in the CRI format: {lines}"
            return [(m.group(2), m.group(3), m.group(4)) for m in found if m]

        async def both_lines() -> list[tuple[str, str, str]]:
            got = records()
            return got if len(got) == 2 else []

        got = await wait_for(both_lines, 30, f"two CRI records in {log}")
        assert sorted(got) == [("stderr", "F", "err-line"), ("stdout", "F", "out-line")]

        name = f"hello-{env.node}_default_main-{container.id}.log"

        async def linked() -> bool:
            return _links(env).get(name) == str(log)

        await wait_for(linked, 30, f"symlink {name} -> {log}")

        env.remove("hello.yaml")
        await env.wait_empty(60)

        async def unlinked() -> bool:
            return not _links(env)

        await wait_for(unlinked, 30, "the pod's symlinks removed")


async def test_rotation_by_size_and_count_while_the_container_keeps_logging(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    max_files = 3
    settings = _settings(tmp_path, healthz_port=port, container_log_max_size="2Ki",
                         container_log_max_files=max_files, container_log_monitor_interval=1.0)
    pad = "x" * 80
    chatty = f'i=0; while true; do echo "line $i {pad}"; i=$((i+1)); usleep 20000; done'
    async with running_agent(containerd, tmp_path, **settings) as env:
        env.write("chatty.yaml", pod_manifest("chatty", chatty))
        await env.wait_running("chatty")
        directory = _container_dir(env, "chatty")
        async with _following(env, port, "chatty") as follower:
            await follower.wait_for("line ")
            await _check_rotation(directory, max_files, follower)


def _number(text: str) -> int:
    return int(text.split()[1])  # "line N xxx..."


async def _check_rotation(directory: Path, max_files: int, follower: _Follower) -> None:
    stamps_seen: set[str] = set()
    most_files = 0

    async def rotated_enough() -> bool:
        nonlocal most_files
        names = os.listdir(directory)
        # A rotation compresses through a .tmp file and removes the plain file after the .gz
        # exists: count rotated files by their timestamp, not by name.
        stamps = {n.split(".")[2] for n in names if n.startswith("0.log.")}
        stamps_seen.update(stamps)
        most_files = max(most_files, len(stamps) + ("0.log" in names))
        has_gz = any(n.endswith(".gz") for n in names)
        plain = [n for n in names if re.fullmatch(r"0\.log\.\d{8}-\d{6}", n)]
        return len(stamps_seen) >= 4 and has_gz and bool(plain)

    await wait_for(rotated_enough, 60, "four rotations, with a gzipped and a plain rotated file")
    assert most_files <= max_files, f"up to {most_files} log files, more than containerLogMaxFiles={max_files}"

    async def snapshot() -> tuple[list[str], list[str], list[str]] | None:
        names = sorted(os.listdir(directory))
        gz = [n for n in names if n.endswith(".gz")]
        plain = [n for n in names if re.fullmatch(r"0\.log\.\d{8}-\d{6}", n)]
        try:  # the next rotation may compress or remove a file under our feet: look again
            with gzip.open(directory / gz[-1]) as f:
                older = [line.content.decode() for line in lr.join(filter(None, map(lr.parse_record, f)))]
            newer = [line.content.decode() for line in lr.read(directory / plain[0])]
        except (FileNotFoundError, IndexError):
            return None
        assert len(plain) == 1, names  # only the newest rotated file stays uncompressed
        assert all(n < plain[0] for n in gz), names
        return names, older, newer

    _, older, newer = await wait_for(snapshot, 30, "a stable view of the rotated files")
    assert older and newer
    assert _number(older[-1]) < _number(newer[0]), "rotated files are not in order"

    # After ReopenContainerLog the container writes into the new live file, which grows.
    async def live_is_newer() -> list[str]:
        live = _contents(directory / "0.log")
        return live if live and _number(live[0]) > _number(newer[-1]) else []

    live = await wait_for(live_is_newer, 30, "the live 0.log continuing after the rotated file")

    async def grew() -> bool:
        now = _contents(directory / "0.log")
        return bool(now) and _number(now[-1]) > _number(live[-1])

    await wait_for(grew, 30, "new lines in the live 0.log")

    # The follower read across every rotation: no line lost, none twice.
    assert follower.process.returncode is None, "-f ended while the container runs"
    followed = [_number(line) for line in follower.output.decode().splitlines()]
    assert followed == list(range(followed[0], followed[-1] + 1)), "lines lost or repeated across rotation"
    assert followed[-1] > _number(newer[0]), "the follower did not get past a rotation"


async def test_logs_command_containers_tail_timestamps_and_follow(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    async with running_agent(containerd, tmp_path, **_settings(tmp_path, healthz_port=port)) as env:
        manifest = pod_manifest("duo")
        manifest["spec"]["containers"] = [
            {"name": "a", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "echo a-1; echo a-2 >&2; echo a-3; exec sleep 3600"]},
            {"name": "b", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", "echo b-1; exec sleep 3600"]},
        ]
        env.write("duo.yaml", manifest)
        pod = f"duo-{env.node}"

        async def both_running() -> bool:
            return len(await env.running_containers("duo")) == 2

        await wait_for(both_running, 30, "both containers running")
        b_id = next(c.id for c in await env.running_containers("duo") if c.metadata and c.metadata.name == "b")

        async def logged() -> bool:
            a, b = _container_dir(env, "duo", "a") / "0.log", _container_dir(env, "duo", "b") / "0.log"
            return len(_contents(a)) == 3 and bool(_contents(b))

        await wait_for(logged, 30, "both containers logged")

        code, out, err = await _cli(env, port, "duo")
        assert code == 1 and out == ""
        assert f"a container name must be specified for pod {pod}, choose one of: [a b]" in err

        # stdout and stderr interleaved as recorded (containerd copies each stream on its own,
        # so the file's order, not the order of the echoes, is what counts)
        recorded = _contents(_container_dir(env, "duo", "a") / "0.log")
        assert sorted(recorded) == ["a-1", "a-2", "a-3"]
        everything = "".join(line + "\n" for line in recorded)
        assert await _cli(env, port, "duo", "-c", "a") == (0, everything, "")

        code, out, _ = await _cli(env, port, f"default/{pod}", "-c", "a", "--tail", "2", "--timestamps")
        stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}(?:Z|[+-]\d\d:\d\d) "
        assert code == 0 and re.fullmatch(f"{stamp}{recorded[1]}\n{stamp}{recorded[2]}\n", out), out

        # -f prints what is written after it started, then keeps going.
        async with _following(env, port, pod, "-c", "b") as follower:
            await follower.wait_for("b-1\n")
            marker = f"marker-{uuid.uuid4().hex[:8]}"
            await env.client.exec_sync(b_id, ["sh", "-c", f"echo {marker} > /proc/1/fd/1"], timeout=10)
            await follower.wait_for(f"b-1\n{marker}\n")
            assert follower.process.returncode is None, "-f ended while the container runs"

        # With no agent answering, the log directories are enough to find the pod (by UID here).
        assert await _cli(env, _free_port(), env.uid_of("duo") or "", "-c", "a") == (0, everything, "")


async def test_logs_previous_after_a_restart(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    async with running_agent(containerd, tmp_path, **_settings(tmp_path, healthz_port=port)) as env:
        env.write("crash.yaml", pod_manifest("crash", "echo boot-$(cat /proc/sys/kernel/random/uuid); sleep 4; exit 1"))
        await env.wait_running("crash")
        directory = _container_dir(env, "crash")

        async def first_logged() -> bool:
            return bool(_contents(directory / "0.log"))

        await wait_for(first_logged, 30, "the first instance's line")
        code, _, err = await _cli(env, port, "crash", "--previous")
        assert code == 1 and f'previous terminated container "main" in pod "crash-{env.node}" not found' in err

        async def second_logged() -> bool:
            return bool(_contents(directory / "1.log"))

        await wait_for(second_logged, 60, "the restarted instance's line")
        first, second = _contents(directory / "0.log"), _contents(directory / "1.log")
        assert first != second

        assert await _cli(env, port, "crash") == (0, second[0] + "\n", "")
        assert await _cli(env, port, "crash", "-p") == (0, first[0] + "\n", "")

        # Both instances exist in the runtime (the dead one is lastState): both have a link.
        async def two_links() -> bool:
            return sorted(_links(env).values()) == [str(directory / "0.log"), str(directory / "1.log")]

        await wait_for(two_links, 30, "a symlink per container instance")

        env.remove("crash.yaml")
        await env.wait_empty(60)

        async def unlinked() -> bool:
            return not _links(env)

        await wait_for(unlinked, 30, "the pod's symlinks removed")


# The stage contract for logs runs in tests/test_contract.py (TestLogsContract).


# --- units: the file format, rotation steps, symlink names, following ---------------------


def test_parse_and_join_partial_records() -> None:
    raw = [
        b"2016-10-06T00:17:09.669794202Z stdout P hello \n",
        b"2016-10-06T00:17:09.669794203Z stderr F oops\n",
        b"2016-10-06T00:17:09.6697942Z stdout F world\n",
        b"not a cri line\n",
        b"2016-10-06T00:17:10+02:00 stdout F:x \n",
    ]
    records = [r for r in map(lr.parse_record, raw) if r]
    assert len(records) == 4
    lines = lr.join(records)
    assert [(ln.stream, ln.content) for ln in lines] == [("stderr", b"oops"), ("stdout", b"hello world"), ("stdout", b"")]
    assert lines[1].render(True) == b"2016-10-06T00:17:09.669794202Z hello world\n"
    assert lines[2].render(True) == b"2016-10-06T00:17:10.000000000+02:00 \n"
    assert lr.fixed_time(b"2016-10-06T00:17:09.6697942+00:00") == b"2016-10-06T00:17:09.669794200Z"


def test_times_are_exact_to_the_nanosecond() -> None:
    assert lr.parse_time(b"1970-01-01T00:00:00Z") == 0
    assert lr.parse_time(b"2016-10-06T00:17:09.669794202Z") == 1475713029_669794202
    assert lr.parse_time(b"2016-10-06T02:17:09.669794202+02:00") == 1475713029_669794202
    assert lr.parse_time(b"2016-10-06 00:17:09Z") is None


def test_tail_and_since_select_lines() -> None:
    lines = [lr.Line(b"t", n, "stdout", str(n).encode(), True) for n in range(10)]
    assert [ln.unix_nanos for ln in lr.select(lines, tail=3)] == [7, 8, 9]
    assert lr.select(lines, tail=0) == []
    assert [ln.unix_nanos for ln in lr.select(lines, since_nanos=8)] == [8, 9]
    assert [ln.unix_nanos for ln in lr.select(lines, tail=5, since_nanos=8)] == [8, 9]
    assert lr.parse_since("90") == 90.0 and lr.parse_since("1h30m") == 5400.0
    with pytest.raises(ValueError):
        lr.parse_since("soon")


def test_rotation_keeps_max_files_compresses_older_and_drops_leftovers(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    for stamp in ("20240101-000001", "20240101-000002", "20240101-000003"):
        (tmp_path / f"0.log.{stamp}").write_text(f"{stamp}\n")
    (tmp_path / "0.log.20240101-000000.gz.tmp").write_text("half")
    (tmp_path / "0.log.20240101-000004").write_text("compressed already\n")
    (tmp_path / "0.log.20240101-000004.gz").write_bytes(gzip.compress(b"compressed already\n"))
    (tmp_path / "1.log.20240101-000001").write_text("another instance\n")
    kept = rotation.prepare(log, max_files=4)  # live + the one rotated next + 2 older
    assert [p.name for p in kept] == ["0.log.20240101-000003.gz", "0.log.20240101-000004.gz"]
    assert sorted(os.listdir(tmp_path)) == ["0.log.20240101-000003.gz", "0.log.20240101-000004.gz",
                                            "1.log.20240101-000001"]
    assert gzip.decompress((tmp_path / "0.log.20240101-000003.gz").read_bytes()) == b"20240101-000003\n"
    assert rotation.rotated_name(log, time.mktime((2006, 1, 2, 15, 4, 5, 0, 0, -1))).name == "0.log.20060102-150405"


async def test_the_links_are_made_again_only_when_the_wanted_ones_change(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The symlink directory holds every pod's links: a pod's runtime change that wants the
    links it already has (probes, status writes) must not scan it again; a link whose log file
    was missing, or a new container, must."""
    from types import SimpleNamespace

    from plugins.logs import LogsStage

    stage = LogsStage(tmp_path / "pods", tmp_path / "links", 10 << 20, 5, 10.0)
    ref = SimpleNamespace(name="web", namespace="default", uid="u1")
    log_dir = stage._log_dir(SimpleNamespace(ref=ref))  # type: ignore[arg-type]
    log_dir.mkdir(parents=True)
    first = SimpleNamespace(name="main", id="c1", log_path=str(log_dir / "main" / "0.log"))
    second = SimpleNamespace(name="main", id="c2", log_path=str(log_dir / "main" / "1.log"))
    observed = SimpleNamespace(containers=[first])
    scans: list[list[str]] = []
    real = symlink.reconcile

    def counting(*args: Any) -> Any:
        scans.append(sorted(args[3]))
        return real(*args)

    monkeypatch.setattr(symlink, "reconcile", counting)
    wakes = iter([
        lambda: Path(first.log_path).parent.mkdir() or Path(first.log_path).touch(),  # the runtime wrote it
        lambda: None, lambda: None,  # changes that want the same links
        lambda: (observed.containers.append(second), Path(second.log_path).touch()),  # a restart
    ])

    class Done(Exception):
        pass

    async def runtime_changed(timeout: float | None = None) -> None:
        await anyio.lowlevel.checkpoint()
        next(wakes, lambda: (_ for _ in ()).throw(Done()))()

    ctx = SimpleNamespace(ref=ref, observed=observed, log=SimpleNamespace(debug=lambda *a, **k: None), runtime_changed=runtime_changed)
    with pytest.raises(Done):
        await stage._keep_links(ctx)  # type: ignore[arg-type]
    one, two = (symlink.link_name("web", "default", "main", c) for c in ("c1", "c2"))
    # Made while the log file was missing, again once it was there, then not until the restart.
    assert scans == [[one], [one], [one, two]], scans
    assert sorted(os.listdir(tmp_path / "links")) == [one, two]


def test_symlink_name_is_truncated_like_the_kubelets() -> None:
    cid = "c" * 64
    assert symlink.link_name("web", "default", "main", cid) == f"web_default_main-{cid}.log"
    long = symlink.link_name("p" * 200, "default", "main", cid)
    assert len(long) == 255 and long.endswith(".log") and long.startswith("p" * 200 + "_default_main-")


def test_follow_reads_across_rotation_without_loss(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"")
    done = threading.Event()

    def writer() -> None:
        f = open(log, "ab", buffering=0)  # noqa: SIM115
        for n in range(300):
            if n and n % 100 == 0:  # rotate: rename, then "ReopenContainerLog"
                os.rename(log, tmp_path / f"0.log.{n}")
                f.write(b"2024-01-01T00:00:00Z stdout F straggler\n")  # written before the reopen
                f.close()
                f = open(log, "ab", buffering=0)  # noqa: SIM115
            f.write(b"2024-01-01T00:00:00Z stdout P line \n2024-01-01T00:00:00Z stdout F %d\n" % n)
            time.sleep(0.001)
        f.close()
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    got: list[bytes] = []

    def lines() -> Iterator[bytes]:
        for batch, _initial in lr.follow(log, lambda: not done.is_set(), poll=0.01, alive_every=0.05):
            yield from (ln.content for ln in batch)

    got = list(lines())
    thread.join()
    numbered = [int(c.split()[1]) for c in got if c.startswith(b"line ")]
    assert numbered == list(range(300))
    assert got.count(b"straggler") == 2


def _record(stream: str, tag: str, content: bytes, second: int = 0) -> bytes:
    return b"2024-01-01T00:00:%02dZ %s %s %s\n" % (second, stream.encode(), tag.encode(), content)


def test_a_long_line_is_read_in_bounded_fragments_that_render_as_the_line(tmp_path: Path) -> None:
    """A container that writes megabytes without a newline: containerd splits it into P
    records; we hand it on in fragments no larger than MAX_LINE_BYTES (plus one record),
    which render (timestamps included) exactly as the joined line."""
    log = tmp_path / "0.log"
    piece = b"y" * 16384
    parts = 8 * lr.MAX_LINE_BYTES // len(piece)
    log.write_bytes(_record("stdout", "F", b"before", 1) + b"".join(_record("stdout", "P", piece, 2)
                                                                    for _ in range(parts))
                    + _record("stdout", "F", b"end", 4) + _record("stderr", "F", b"after", 5))
    lines = [line for batch in lr.stream(log) for line in batch]
    assert max(len(line.content) for line in lines) <= lr.MAX_LINE_BYTES + len(piece)
    assert len(lines) > 8
    rendered = b"".join(line.render(True) for line in lines)
    assert rendered == (b"2024-01-01T00:00:01.000000000Z before\n"
                        b"2024-01-01T00:00:02.000000000Z " + piece * parts + b"end\n"
                        b"2024-01-01T00:00:05.000000000Z after\n")
    # --tail counts lines, not fragments; the fragments go with their line.
    tail = b"".join(line.render(False) for batch in lr.stream(log, tail=2) for line in batch)
    assert tail == piece * parts + b"end\nafter\n"
    assert [line.content for line in lr.select(lines, tail=1)] == [b"after"]
    # --since looks at a line's first record, for every fragment of it.
    since = lr.parse_time(b"2024-01-01T00:00:02Z")
    kept = b"".join(line.render(False) for batch in lr.stream(log, since_nanos=since) for line in batch)
    assert kept == piece * parts + b"end\nafter\n"


def test_stream_and_follow_select_as_the_whole_file_would(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"".join(_record("stdout" if n % 3 else "stderr", "F", b"%d" % n, n % 60) for n in range(500))
                    + b"not a cri line\n" + _record("stdout", "F", b"10%\r20%", 59) + _record("stdout", "P", b"open", 59))
    whole = lr.join(r for r in map(lr.parse_record, log.read_bytes().split(b"\n")) if r)
    assert whole[-2].content == b"10%\r20%"  # a carriage return is content, not a line end
    since = lr.parse_time(b"2024-01-01T00:00:30Z")
    for tail, since_nanos in ((None, None), (0, None), (7, None), (7, since), (None, since), (10_000, None)):
        streamed = [line for batch in lr.stream(log, tail, since_nanos) for line in batch]
        assert streamed == lr.select(whole, tail, since_nanos), (tail, since_nanos)
        # A follower shows the same, the unfinished line once the writer is gone.
        followed = [line for batch, _ in lr.follow(log, lambda: False, tail=tail, since_nanos=since_nanos, poll=0.01,
                                                   alive_every=0.01) for line in batch]
        complete = lr.select(whole[:-1], tail, since_nanos)
        assert followed == complete + lr.select(whole[-1:], None, since_nanos), (tail, since_nanos)


def test_garbage_without_newlines_is_skipped_not_kept(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(_record("stdout", "F", b"one") + b"z" * (3 * lr.MAX_RECORD_BYTES) + b"\n"
                    + _record("stdout", "F", b"two"))
    assert [line.content for line in lr.read(log)] == [b"one", b"two"]


def _pod_dirs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    for pod, containers in {"default_web-n1_u1": {"a": [0, 1], "b": [0]}, "kube-system_web-n1_u2": {"c": [0]},
                            "default_solo-n1_u3": {"main": [2]}, "default_new-n1_u4": {"main": []}}.items():
        for container, runs in containers.items():
            (logs / pod / container).mkdir(parents=True)
            for n in runs:
                (logs / pod / container / f"{n}.log").write_bytes(b"2024-01-01T00:00:00Z stdout F x\n")
    return logs


def test_pods_and_containers_are_found_with_the_api_servers_messages(tmp_path: Path) -> None:
    logs = _pod_dirs(tmp_path)
    solo = lr.find_pod("solo", logs, None, "n1")  # a static pod by its manifest's name, no agent
    assert (solo.pod.uid, solo.containers) == ("u3", ("main",))
    assert lr.choose_container(solo, None) == "main"
    assert lr.log_file(solo, "main") == (logs / "default_solo-n1_u3" / "main" / "2.log", 2)
    with pytest.raises(lr.LogsError, match='previous terminated container "main" in pod "solo-n1" not found'):
        lr.log_file(solo, "main", previous=True)
    with pytest.raises(lr.LogsError, match="names more than one pod"):
        lr.find_pod("web-n1", logs, None, "n1")
    web = lr.find_pod("default/web-n1", logs, None, "n1")
    assert lr.find_pod("u1", logs, None, "n1") == web
    with pytest.raises(lr.LogsError, match=re.escape("a container name must be specified for pod web-n1, "
                                                     "choose one of: [a b]")):
        lr.choose_container(web, None)
    with pytest.raises(lr.LogsError, match="container nope is not valid for pod web-n1"):
        lr.choose_container(web, "nope")
    assert lr.log_file(web, "a", previous=True) == (logs / "default_web-n1_u1" / "a" / "0.log", 0)
    with pytest.raises(lr.LogsError, match='pods "nobody" not found'):
        lr.find_pod("nobody", logs, None, "n1")
    new = lr.find_pod("new-n1", logs, None, "n1")
    with pytest.raises(lr.LogsError, match='container "main" in pod "new-n1" is waiting to start: ContainerCreating'):
        lr.log_file(new, "main")


def test_the_agents_rows_give_container_order_init_containers_and_liveness(tmp_path: Path) -> None:
    logs = _pod_dirs(tmp_path)
    status = {"containerStatuses": [{"name": "b", "restartCount": 0, "state": {"running": {}}},
                                    {"name": "a", "restartCount": 1, "state": {"running": {}}}],
              "initContainerStatuses": [{"name": "setup", "restartCount": 0, "state": {"terminated": {}}}]}
    rows: list[dict[str, Any]] = [{"namespace": "default", "name": "web-n1", "uid": "u1", "status": status}]
    web = lr.find_pod("web-n1", logs, rows, "n1")  # the agent knows it: no ambiguity with kube-system's
    with pytest.raises(lr.LogsError, match=re.escape("choose one of: [b a] or one of the init containers: [setup]")):
        lr.choose_container(web, None)
    assert lr.choose_container(web, "setup") == "setup"
    assert lr.writer_alive(web, "a", 1, lambda: rows)()
    assert lr.writer_alive(web, "a", 1, lambda: None)()  # agent gone: the files say nothing changed
    assert not lr.writer_alive(web, "a", 0, lambda: rows)()  # 1.log exists: instance 0 is done
    assert not lr.writer_alive(web, "a", 1, list)()  # the agent forgot the pod
    status["containerStatuses"][1]["state"] = {"terminated": {}}
    assert not lr.writer_alive(web, "a", 1, lambda: rows)()
