"""The container-lifecycle harness (upstream test/e2e_node/container_lifecycle_pod_construction.go).

Every container of a lifecycle test runs :func:`exec_command`: a shell script that stamps each
step (``Starting``, ``Started``, ``Delaying``, ``Looping``, ``Exiting``) with an RFC 3339 time
into a per-container file on the pod's ``/persistent`` emptyDir and into the container's stdout
(``/proc/1/fd/1``, so hooks and probes that run the same script show up in the container's log
too). :func:`parse_output` reads every container's log back, sorts the stamps by time, and the
:class:`Timeline` predicates answer the ordering questions the tests ask.

One substitution: upstream builds the millisecond timestamp with busybox ``nmeter``, which the
Debian busybox our image is built from does not have; the time comes from ash's
``$EPOCHREALTIME`` (microseconds) instead. The stamp format is the same RFC 3339 UTC time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# `date` prints seconds only; $EPOCHREALTIME gives the fraction of the same instant.
_NOW = "`t=$EPOCHREALTIME; date -u -d @${t%.*} +%FT%T.${t#*.}Z`"

LIVENESS = "Liveness"
POST_START = "PostStart"
PRE_STOP = "PreStop"
READINESS = "Readiness"
STARTUP = "Startup"


def prefixed(prefix: str, name: str) -> str:
    return f"{prefix}-{name}"


def _sleep(seconds: int) -> str:
    # In the background and waited for, so the shell runs its TERM trap during the sleep.
    return f"exec sleep {seconds} & wait $!; "


def exec_command(name: str, *, exit_code: int = 0, start_delay: int = 0, delay: int = 0,
                 loop_forever: bool = False, termination_seconds: int = 0,
                 container_name: str = "") -> list[str]:
    """ExecCommand(name, execCommand{...}): ``["sh", "-c", script]``. ``container_name`` is set
    for hooks and probes: they log into that container's file and do not replay it."""
    log = f"/persistent/{container_name or name}.log"

    def say(what: str) -> str:
        return f"echo {_NOW} '{name} {what}' | tee -a {log} >> /proc/1/fd/1; "

    script = f"touch {log}; "
    if not container_name:
        # A restarted container first replays what earlier instances logged.
        script += f"cat {log} >> /proc/1/fd/1; "
    script += say(f"Starting {start_delay}")
    script += (f"_term() {{ sleep {termination_seconds}; echo {_NOW} '{name} Exiting' | tee -a {log} "
               f">> /proc/1/fd/1; exit {exit_code}; }}; ")
    script += "trap _term TERM; "
    if start_delay:
        script += _sleep(start_delay)
    script += "touch started; "
    script += say("Started")
    script += say(f"Delaying {delay}")
    if delay:
        script += _sleep(delay)
    if loop_forever:
        script += f"while true; do echo {_NOW} '{name} Looping' | tee -a {log} >> /proc/1/fd/1 ; sleep 1 ; done; "
    script += f"echo {_NOW} '{name} Exiting'  | tee -a {log} >> /proc/1/fd/1; "
    script += f"exit {exit_code}"
    return ["sh", "-c", script]


def prepare_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """preparePod: every container gets memory requests 15Mi / limits 35Mi and the emptyDir
    ``persistent`` at /persistent, which replaces the pod's volumes."""
    spec = pod["spec"]
    for key in ("containers", "initContainers"):
        for container in spec.get(key, []):
            container["resources"] = {"requests": {"memory": "15Mi"}, "limits": {"memory": "35Mi"}}
            container["volumeMounts"] = [{"name": "persistent", "mountPath": "/persistent"}]
    spec["volumes"] = [{"name": "persistent", "emptyDir": {}}]
    return pod


@dataclass(frozen=True)
class Stamp:
    time: datetime
    container: str
    command: str


class Timeline(list[Stamp]):
    """containerOutputList: the stamps in time order, and the ordering predicates. Each raises
    AssertionError with the whole timeline, as upstream's errors carry it."""

    def __str__(self) -> str:
        return "\n".join(f"{i}) {s.time.isoformat()} {s.container} {s.command}" for i, s in enumerate(self))

    def _find(self, name: str, command: str, start: int = 0) -> int:
        for i in range(start, len(self)):
            if self[i].container == name and self[i].command == command:
                return i
        return -1

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"{message}, got\n{self}")

    def starts_before(self, lhs: str, rhs: str) -> None:
        """``lhs Started`` is followed by ``rhs Starting`` (works for a restart: lhs == rhs)."""
        lhs_start = self._find(lhs, "Started")
        if lhs_start == -1:
            raise self._fail(f"couldn't find that {lhs} ever started")
        if self._find(rhs, "Starting", lhs_start + 1) == -1:
            raise self._fail(f"couldn't find that {rhs} started after {lhs}")

    def exits_before(self, lhs: str, rhs: str) -> None:
        lhs_exit = self._find(lhs, "Exiting")
        if lhs_exit == -1:
            raise self._fail(f"couldn't find that {lhs} ever exited")
        if self._find(rhs, "Exiting", lhs_exit + 1) == -1:
            raise self._fail(f"couldn't find that {rhs} starting before {lhs} exited (starting at idx {lhs_exit + 1})")

    def run_together(self, lhs: str, rhs: str) -> None:
        """Both ran, rhs started after lhs and before lhs exited, and lhs before rhs exited."""
        lhs_start = self._find(lhs, "Started")
        if lhs_start == -1:
            raise self._fail(f"couldn't find that {lhs} ever started")
        rhs_start = self._find(rhs, "Started", lhs_start + 1)
        if rhs_start == -1:
            raise self._fail(f"couldn't find that {rhs} ever started")
        lhs_exit = self._find(lhs, "Exiting", lhs_start + 1)
        if lhs_exit == -1:
            raise self._fail(f"couldn't find that {lhs} ever exited")
        if rhs_start > lhs_exit:
            raise self._fail(f"expected {rhs} to start before exiting {lhs}")
        rhs_exit = self._find(rhs, "Exiting", rhs_start + 1)
        if rhs_exit == -1:
            raise self._fail(f"couldn't find that {rhs} ever exited")
        if lhs_start > rhs_exit:
            raise self._fail(f"expected {lhs} to start before exiting {rhs}")

    def starts(self, name: str) -> None:
        if self._find(name, "Started") == -1:
            raise self._fail(f"couldn't find that {name} ever started")

    def doesnt_start(self, name: str) -> None:
        if self._find(name, "Started") != -1:
            raise self._fail(f"find {name} started, but didn't expect to")

    def exits(self, name: str) -> None:
        if self._find(name, "Exiting") == -1:
            raise self._fail(f"couldn't find that {name} ever exited")

    def has_restarted(self, name: str) -> None:
        first = self._find(name, "Starting")
        if first == -1:
            raise self._fail(f"couldn't find that {name} ever started")
        if self._find(name, "Starting", first + 1) == -1:
            raise self._fail(f"couldn't find that {name} ever restarted")

    def has_not_restarted(self, name: str) -> None:
        first = self._find(name, "Starting")
        if first == -1:
            raise self._fail(f"couldn't find that {name} ever started")
        if self._find(name, "Starting", first + 1) != -1:
            raise self._fail(f"found that {name} restarted but wasn't expected to")


def parse(text: str) -> Timeline:
    """The stamps of concatenated container logs, sorted by time (a stable sort, as Go's
    sort.Slice is not, but stamps of one instant keep their log order)."""
    stamps = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            raise AssertionError(f"{fields} should have at least length 3")
        try:
            when = datetime.fromisoformat(fields[0])
        except ValueError as exc:
            raise AssertionError(f"bad timestamp in harness line {line!r}: {exc}") from None
        stamps.append(Stamp(when, fields[1], fields[2]))
    return Timeline(sorted(stamps, key=lambda s: s.time))


def parse_output(status: dict[str, Any], logs: Callable[[str, bool], str]) -> Timeline:
    """parseOutput: the logs of every init and regular container named in the status (the
    previous instance's when the current one has none), parsed and sorted."""
    names: Sequence[str] = [cs["name"] for key in ("initContainerStatuses", "containerStatuses")
                            for cs in status.get(key, [])]
    chunks = []
    for name in names:
        try:
            chunks.append(logs(name, False))
        except AssertionError:
            try:
                chunks.append(logs(name, True))
            except AssertionError:
                pass  # upstream logs the error and goes on: the container never ran
    return parse("".join(chunks))


__all__ = ["LIVENESS", "POST_START", "PRE_STOP", "READINESS", "STARTUP", "Stamp", "Timeline", "exec_command",
           "parse", "parse_output", "prefixed", "prepare_pod"]
