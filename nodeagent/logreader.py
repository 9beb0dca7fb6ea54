"""Reading CRI container log files, as `kubectl logs` shows them (the kubelet's kuberuntime/logs).

containerd writes one record per line: ``<RFC3339Nano time> <stdout|stderr> <P|F>[:tags] <content>``;
a line longer than its buffer is split into ``P`` (partial) records ending with one ``F`` record.
Files live at ``podLogsDir/<namespace>_<name>_<uid>/<container>/<restartCount>.log``; the kubelet
rotates them to ``<n>.log.<timestamp>`` (older ones gzipped). Like the kubelet, we show only the
live file of an instance (rotated files are for log shippers), and follow it across rotation.

Files are read in chunks and handed on in batches; nothing holds a whole file. ``--tail``
reads the file twice (count, then skip) instead of keeping lines; a logical line made of many
partial records is handed on in fragments of at most ``MAX_LINE_BYTES`` (rendered, the
fragments are the line); a "record" longer than ``MAX_RECORD_BYTES`` without a newline is
not containerd's and is skipped.

This module knows files only; which pod and container the user means is decided by the caller.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from nodeagent import hostpaths

_TIME = re.compile(rb"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")
_LOG_FILE = re.compile(r"^(\d+)\.log$")
# How often a follower looks for new data and for rotation (the kubelet uses fsnotify).
FOLLOW_POLL_SECONDS = 0.1
# How often a follower asks whether the container still runs, when it has nothing to read.
FOLLOW_ALIVE_CHECK_SECONDS = 1.0
READ_CHUNK = 64 * 1024
MAX_RECORD_BYTES = 1024 * 1024
"""containerd splits lines at 16 KiB; a longer run of bytes without a newline is garbage."""
MAX_LINE_BYTES = 256 * 1024
"""A joined line is passed on in fragments of at most this size (plus one record)."""


@dataclass(frozen=True)
class Record:
    """One line of a CRI log file."""

    time: bytes
    """The timestamp as written (RFC3339Nano: trailing zeros of the fraction are dropped)."""
    unix_nanos: int
    stream: str
    partial: bool
    content: bytes


@dataclass(frozen=True)
class Line:
    """A logical line: partial records joined. ``complete`` is False for a line whose last
    record is still partial (the container has not finished writing it)."""

    time: bytes
    unix_nanos: int
    stream: str
    content: bytes
    complete: bool
    continued: bool = False
    """A later fragment of a long line (same time as its first fragment; no prefix of its own)."""

    def render(self, timestamps: bool) -> bytes:
        prefix = fixed_time(self.time) + b" " if timestamps and not self.continued else b""
        return prefix + self.content + (b"\n" if self.complete else b"")


def parse_time(raw: bytes) -> int | None:
    """Nanoseconds since the epoch of an RFC3339(Nano) time, or None if it is not one."""
    m = _TIME.match(raw)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction = (m.group(7) or b"").ljust(9, b"0")
    zone = m.group(8)
    offset = 0
    if zone != b"Z":
        sign = -1 if zone[:1] == b"-" else 1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    days = _days_from_civil(year, month, day)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset
    return seconds * 1_000_000_000 + int(fraction)


def _days_from_civil(y: int, m: int, d: int) -> int:
    # Howard Hinnant's algorithm: no datetime, so nanoseconds and any offset survive exactly.
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def fixed_time(raw: bytes) -> bytes:
    """The kubelet's output format for --timestamps (RFC3339NanoFixed: always nine digits);
    a zero offset is written ``Z`` as Go does."""
    m = _TIME.match(raw)
    if m is None:
        return raw
    zone = m.group(8)
    if zone in (b"+00:00", b"-00:00"):
        zone = b"Z"
    date_time = raw[: raw.index(b"T") + 9]
    return date_time + b"." + (m.group(7) or b"").ljust(9, b"0") + zone


def parse_record(raw: bytes) -> Record | None:
    """One CRI log line (without or with its newline); None if it is not in the CRI format
    (the kubelet skips such lines too)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    parts = raw.split(b" ", 3)
    if len(parts) < 3:
        return None
    stamp, stream, tags = parts[0], parts[1], parts[2]
    nanos = parse_time(stamp)
    if nanos is None or stream not in (b"stdout", b"stderr"):
        return None
    tag = tags.split(b":", 1)[0]
    if tag not in (b"P", b"F"):
        return None
    return Record(stamp, nanos, stream.decode(), tag == b"P", parts[3] if len(parts) == 4 else b"")


class Joiner:
    """Joins partial records into lines as they arrive. Partials of stdout and stderr are joined
    separately (containerd splits each stream on its own); a line takes its first record's time.
    A line that grows past ``max_line`` bytes is handed on in fragments, so memory stays bounded
    whatever a container writes without a newline; a line of the other stream that completes
    meanwhile then comes out between two fragments, in file order, as the kubelet (which never
    joins records) shows every record."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._pending: dict[str, list[Record]] = {}
        self._size: dict[str, int] = {}
        self._first: dict[str, Record] = {}
        """Per stream: the first record of a line some fragments of which were handed on."""
        self._max = max_line

    def feed(self, records: Iterable[Record]) -> list[Line]:
        out = []
        for r in records:
            parts = self._pending.setdefault(r.stream, [])
            parts.append(r)
            size = self._size[r.stream] = self._size.get(r.stream, 0) + len(r.content)
            if not r.partial:
                out.append(self._line(r.stream, complete=True))
            elif size >= self._max:
                out.append(self._line(r.stream, complete=False))
        return out

    def flush(self) -> list[Line]:
        """The unfinished lines (the writer is gone: nobody will finish them)."""
        out = [self._line(stream, complete=False) for stream, parts in list(self._pending.items()) if parts]
        self._pending.clear()
        self._size.clear()
        self._first.clear()
        return out

    def _line(self, stream: str, complete: bool) -> Line:
        parts = self._pending[stream]
        first = self._first.get(stream)
        start = first or parts[0]
        line = Line(start.time, start.unix_nanos, stream, b"".join(p.content for p in parts), complete,
                    continued=first is not None)
        if complete:
            self._first.pop(stream, None)
        elif first is None:
            self._first[stream] = start
        parts.clear()
        self._size[stream] = 0
        return line


def join(records: Iterable[Record]) -> list[Line]:
    joiner = Joiner()
    return joiner.feed(records) + joiner.flush()


class Selection:
    """``--since`` then ``--tail`` over lines that arrive in batches: a line is kept when its
    (first record's) time is at or after ``since_nanos`` and it is not among the first ``skip``
    such lines; a fragment goes with the line it continues."""

    def __init__(self, since_nanos: int | None = None, skip: int = 0) -> None:
        self.since = since_nanos
        self.skip = skip
        self.seen = 0
        self._open: dict[str, bool] = {}

    def __call__(self, lines: Iterable[Line]) -> list[Line]:
        out = []
        for line in lines:
            if line.continued:
                keep = self._open.get(line.stream, False)
            else:
                keep = self.since is None or line.unix_nanos >= self.since
                if keep:
                    keep = self.seen >= self.skip
                    self.seen += 1
                self._open[line.stream] = keep
            if keep:
                out.append(line)
        return out


def _skip_for(total: int, tail: int | None) -> int:
    return 0 if tail is None or tail < 0 else max(0, total - tail)


def select(lines: Iterable[Line], tail: int | None = None, since_nanos: int | None = None) -> list[Line]:
    """``--since`` then ``--tail``, as kubectl applies them (tail counts what since kept)."""
    lines = list(lines)
    counting = Selection(since_nanos, skip=len(lines) + 1)
    counting(lines)
    return Selection(since_nanos, _skip_for(counting.seen, tail))(lines)


class _Chunks:
    """Complete raw lines of a file, read a chunk at a time. What follows the last newline is
    kept for the next read (a line containerd is in the middle of writing), up to
    MAX_RECORD_BYTES; past that it is dropped up to the next newline."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self._carry = bytearray()
        self._skipping = False

    def read(self, limit: int | None = None) -> list[bytes] | None:
        """The complete lines in the next chunk ([] if none completed), None at end of file."""
        size = READ_CHUNK if limit is None else min(READ_CHUNK, limit)
        if size <= 0:
            return None
        chunk = self.f.read(size)
        if not chunk:
            return None
        if self._skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                return []
            chunk = chunk[cut + 1:]
            self._skipping = False
        self._carry += chunk
        cut = self._carry.rfind(b"\n")
        if cut < 0:
            if len(self._carry) > MAX_RECORD_BYTES:
                self._carry.clear()
                self._skipping = True
            return []
        # On newlines only: a record's content may hold \r (a progress bar), which
        # bytes.splitlines would cut the record at.
        lines = bytes(self._carry[:cut]).split(b"\n")
        del self._carry[: cut + 1]
        return lines

    def restart(self, f: BinaryIO) -> None:
        self.f = f
        self._carry.clear()
        self._skipping = False


def _records(raw_lines: Iterable[bytes]) -> Iterator[Record]:
    for raw in raw_lines:
        record = parse_record(raw)
        if record is not None:
            yield record


def _batches(f: BinaryIO, end: int, joiner: Joiner) -> Iterator[list[Line]]:
    """Lines of ``f`` from where it is up to byte ``end``, a chunk's worth at a time."""
    chunks = _Chunks(f)
    while True:
        raw = chunks.read(end - f.tell())
        if raw is None:
            return
        if raw:
            yield joiner.feed(_records(raw))


def _count(path: Path, end: int, since_nanos: int | None, flush: bool) -> int:
    """How many lines ``--since`` keeps among the first ``end`` bytes (the first pass of --tail)."""
    if since_nanos is None:
        return _count_lines(path, end, flush)
    counting = Selection(since_nanos, skip=1 << 62)
    joiner = Joiner()
    with open(path, "rb") as f:
        for lines in _batches(f, end, joiner):
            counting(lines)
    if flush:
        counting(joiner.flush())
    return counting.seen


def _count_lines(path: Path, end: int, flush: bool) -> int:
    """Lines without --since: every F record ends one, and a stream whose last record is P has
    one more, unfinished (if ``flush``). No times parsed, no lines built."""
    complete = 0
    last_partial: dict[bytes, bool] = {}
    with open(path, "rb") as f:
        chunks = _Chunks(f)
        while (raw := chunks.read(end - f.tell())) is not None:
            for record in raw:
                parts = record.split(b" ", 3)
                if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or not _TIME.match(parts[0]):
                    continue
                tag = parts[2].split(b":", 1)[0]
                if tag == b"F":
                    complete += 1
                    last_partial[parts[1]] = False
                elif tag == b"P":
                    last_partial[parts[1]] = True
    return complete + (sum(last_partial.values()) if flush else 0)


def stream(path: Path, tail: int | None = None, since_nanos: int | None = None) -> Iterator[list[Line]]:
    """The lines of one log file as it is now, ``--since`` and ``--tail`` applied, in batches
    of about a chunk; partials the writer has not finished come last, unfinished."""
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        skip = _skip_for(_count(path, end, since_nanos, flush=True), tail) if tail is not None else 0
        selection = Selection(since_nanos, skip)
        joiner = Joiner()
        for lines in _batches(f, end, joiner):
            kept = selection(lines)
            if kept:
                yield kept
        kept = selection(joiner.flush())
        if kept:
            yield kept


def read(path: Path) -> list[Line]:
    """Every line of one log file, partials joined (for small files: tests, conformance)."""
    return [line for batch in stream(path) for line in batch]


def follow(path: Path, alive: Callable[[], bool], *, tail: int | None = None, since_nanos: int | None = None,
           poll: float = FOLLOW_POLL_SECONDS,
           alive_every: float = FOLLOW_ALIVE_CHECK_SECONDS) -> Iterator[tuple[list[Line], bool]]:
    """Read ``path`` and keep reading it as it grows, across rotation, until ``alive()`` says the
    writer is gone (then what is left is read and the iteration ends).

    Yields ``(lines, initial)``: first what is already in the file, ``--tail`` and ``--since``
    applied (``initial`` True; possibly several batches, possibly none), then batches of new
    lines (``--since`` still applied, as the kubelet does).

    Rotation renames the file and has the runtime reopen it at the same path: when the path
    names another file (or none), the old one is read to its end before the new one is opened
    from its start, so no line is lost or shown twice.
    """
    f = open(path, "rb")  # noqa: SIM115 - it is swapped for the new file on rotation
    try:
        end = os.fstat(f.fileno()).st_size
        skip = _skip_for(_count(path, end, since_nanos, flush=False), tail) if tail is not None else 0
        selection = Selection(since_nanos, skip)
        joiner = Joiner()
        chunks = _Chunks(f)
        while True:  # what is there: up to the size at open, so a fast writer cannot make it endless
            raw = chunks.read(end - f.tell())
            if raw is None:
                break
            if raw:
                kept = selection(joiner.feed(_records(raw)))
                if kept:
                    yield kept, True
        last_alive_check = time.monotonic()
        while True:
            got = chunks.read()
            if got is not None:
                kept = selection(joiner.feed(_records(got)))
                if kept:
                    yield kept, False
                continue
            if _rotated(path, f):
                rest: list[Line] = []
                while (more := chunks.read()) is not None:
                    rest += selection(joiner.feed(_records(more)))
                    if len(rest) > 256:
                        yield rest, False
                        rest = []
                try:
                    new = open(path, "rb")  # noqa: SIM115
                except FileNotFoundError:
                    new = None  # renamed, not yet reopened by the runtime: look again soon
                if new is not None:
                    f.close()
                    f = new
                    chunks.restart(f)
                if rest:
                    yield rest, False
                if new is not None:
                    continue
            now = time.monotonic()
            if now - last_alive_check >= alive_every:
                last_alive_check = now
                if not alive():
                    rest = []
                    while (more := chunks.read()) is not None:
                        rest += selection(joiner.feed(_records(more)))
                    rest += selection(joiner.flush())
                    yield rest, False
                    return
            time.sleep(poll)
    finally:
        f.close()


def _rotated(path: Path, f: BinaryIO) -> bool:
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return True
    mine = os.fstat(f.fileno())
    return (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino)


# --- where the files are -----------------------------------------------------------------


def pod_log_dir(pod_logs_dir: Path, namespace: str, name: str, uid: str) -> Path:
    """``<namespace>_<name>_<uid>`` (hashed to fit a file name when longer: :func:`scan` does
    not find such a directory; the agent's rows do)."""
    return hostpaths.pod_log_dir(pod_logs_dir, namespace, name, uid)


def _container_dir(target: Target, container: str) -> Path:
    try:
        return hostpaths.container_log_dir(target.pod.path, container)
    except hostpaths.UnsafeName as exc:
        raise LogsError(str(exc)) from None


def attempts(container_dir: Path) -> list[int]:
    """The restart counts that have a live log file (``<n>.log``), ascending."""
    try:
        names = os.listdir(container_dir)
    except FileNotFoundError:
        return []
    found = (_LOG_FILE.match(n) for n in names)
    return sorted(int(m.group(1)) for m in found if m)


@dataclass(frozen=True)
class PodDir:
    namespace: str
    name: str
    uid: str
    path: Path


def scan(pod_logs_dir: Path) -> list[PodDir]:
    """The pods that have a log directory (``<namespace>_<name>_<uid>``; none of the three may
    contain ``_``, so the split is exact)."""
    out = []
    try:
        entries = sorted(os.scandir(pod_logs_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for entry in entries:
        parts = entry.name.split("_")
        if len(parts) == 3 and entry.is_dir():
            out.append(PodDir(parts[0], parts[1], parts[2], Path(entry.path)))
    return out


def parse_since(text: str) -> float:
    """``--since``: seconds, or a Go-style duration like ``90s``, ``5m``, ``1h30m``."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r} (use seconds or e.g. 30s, 5m, 1h)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


# --- which files the user means ----------------------------------------------------------
#
# The pod is found through the running agent's /pods rows when it answers (they carry the
# container names in spec order and their states), else from the log directories alone.

Rows = list[dict[str, Any]]


class LogsError(Exception):
    """What to tell the user; messages follow the API server's and the kubelet's."""


@dataclass(frozen=True)
class Target:
    pod: PodDir
    containers: tuple[str, ...]
    init_containers: tuple[str, ...] = ()
    statuses: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    from_agent: bool = False


def _matches(query: str, namespace: str, name: str, uid: str, node: str) -> bool:
    # Static pods are named <name>-<node>: accept the manifest's name too.
    return query in (uid, f"{namespace}/{name}", name) or f"{query}-{node}" == name


def _pick(query: str, found: list[PodDir]) -> PodDir:
    if not found:
        raise LogsError(f'pods "{query}" not found')
    if len({(p.namespace, p.name, p.uid) for p in found}) > 1:
        names = ", ".join(f"{p.namespace}/{p.name} ({p.uid})" for p in found)
        raise LogsError(f"{query!r} names more than one pod ({names}); give NAMESPACE/NAME or the UID")
    return found[0]


def find_pod(query: str, pod_logs_dir: Path, rows: Rows | None, node: str) -> Target:
    """The pod named by ``query`` (NAME, NAMESPACE/NAME or UID)."""
    candidates = [r for r in rows or [] if _matches(query, r["namespace"], r["name"], r["uid"], node)]
    if candidates:
        pod = _pick(query, [PodDir(r["namespace"], r["name"], r["uid"],
                                   pod_log_dir(pod_logs_dir, r["namespace"], r["name"], r["uid"]))
                            for r in candidates])
        status = next(r for r in candidates if r["uid"] == pod.uid).get("status", {})
        regular = list(status.get("containerStatuses", []))
        init = list(status.get("initContainerStatuses", []))
        if not regular:  # no status yet: the directories are all we know
            return Target(pod, _container_dirs(pod.path), from_agent=True)
        return Target(pod, tuple(cs["name"] for cs in regular), tuple(cs["name"] for cs in init),
                      {cs["name"]: cs for cs in regular + init}, from_agent=True)
    pod = _pick(query, [p for p in scan(pod_logs_dir) if _matches(query, p.namespace, p.name, p.uid, node)])
    return Target(pod, _container_dirs(pod.path))


def _container_dirs(pod_dir: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(e.name for e in os.scandir(pod_dir) if e.is_dir()))
    except FileNotFoundError:
        return ()


def choose_container(target: Target, container: str | None) -> str:
    """``-c`` or the pod's only container; the API server's messages otherwise."""
    name = target.pod.name
    if container:
        if container not in target.containers and container not in target.init_containers:
            raise LogsError(f"container {container} is not valid for pod {name}")
        return container
    if len(target.containers) == 1:
        return target.containers[0]
    if not target.containers:
        raise LogsError(f"a container name must be specified for pod {name}")
    message = f"a container name must be specified for pod {name}, choose one of: [{' '.join(target.containers)}]"
    if target.init_containers:
        message += f" or one of the init containers: [{' '.join(target.init_containers)}]"
    raise LogsError(message)


def log_file(target: Target, container: str, previous: bool = False) -> tuple[Path, int]:
    """The live log file of the container's current instance (or of the one before it), and
    that instance's restart count. The kubelet's messages when there is none."""
    directory = _container_dir(target, container)
    found = attempts(directory)
    pod = target.pod.name
    if not found:
        waiting = target.statuses.get(container, {}).get("state", {}).get("waiting", {})
        raise LogsError(f'container "{container}" in pod "{pod}" is waiting to start: '
                        f'{waiting.get("reason") or "ContainerCreating"}')
    attempt = found[-1]
    if previous:
        attempt -= 1
        if attempt not in found:
            raise LogsError(f'previous terminated container "{container}" in pod "{pod}" not found')
    return directory / f"{attempt}.log", attempt


def writer_alive(target: Target, container: str, attempt: int,
                 fetch: Callable[[], Rows | None]) -> Callable[[], bool]:
    """For ``follow``: False once the followed instance will write no more — a newer instance
    has a log file, the pod's logs are gone, or the agent shows the instance not running (or
    has forgotten the pod). Without an agent only the files can tell."""
    directory = _container_dir(target, container)

    def alive() -> bool:
        found = attempts(directory)
        if not found or found[-1] > attempt:
            return False
        rows = fetch()
        if rows is None:
            return True
        row = next((r for r in rows if r["uid"] == target.pod.uid), None)
        if row is None:
            return not target.from_agent
        status = row.get("status", {})
        for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
            if cs.get("name") == container and cs.get("restartCount", 0) >= attempt:
                return cs.get("restartCount") == attempt and "running" in cs.get("state", {})
        return True

    return alive


__all__ = ["Joiner", "Line", "LogsError", "PodDir", "Record", "Selection", "Target", "attempts", "choose_container",
           "find_pod", "fixed_time", "follow", "join", "log_file", "parse_record", "parse_since", "parse_time",
           "pod_log_dir", "read", "scan", "select", "stream", "writer_alive"]
