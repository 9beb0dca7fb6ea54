"""Files the agent keeps state in across restarts (pod status files, image pull records, the
DRA checkpoint): written so that a crash or power cut leaves the old version or the new one,
never half of either; read so that a damaged or foreign file is moved aside and reported,
never fatal.

Writing is tmp + fsync + rename + fsync of the directory (the rename itself must reach the
disk). The temporary file is made in the target's directory, so the rename stays on one
filesystem, with the final mode from the start (0600 unless asked otherwise: state is the
agent's business).
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import structlog

log = structlog.get_logger("nodeagent.statefile")

T = TypeVar("T")

CORRUPT_SUFFIX = ".corrupt-"
"""A file that could not be read is renamed ``<name>.corrupt-<unix seconds>`` beside itself."""


class StateFileError(Exception):
    """The file's content is not what its reader expects (the message says what)."""


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` in one step. ``durable``: fsync the file and the
    directory (a file the agent relies on after a restart); without it only the atomicity
    holds (a crash of the agent, not of the machine)."""
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        sync_directory(path.parent)


def ensure_private_dir(path: Path, mode: int = 0o750) -> None:
    """``path`` exists as a directory no other user can read (the kubelet's 0750 for its root
    and pod directories): made with ``mode``; an existing one with wider permissions (made
    by an older version, or by hand) is narrowed to them, and that is logged."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        os.chmod(path, current & mode)
        log.warning("directory permissions narrowed", path=str(path), was=oct(current), now=oct(current & mode))


def sync_directory(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_or_quarantine(path: Path, parse: Callable[[bytes], T], *, what: str) -> T | None:
    """``parse`` of the file's bytes; None when the file does not exist. A file that cannot
    be read or that ``parse`` refuses (any ValueError, StateFileError, KeyError, TypeError) is
    renamed aside (see :func:`quarantine`), logged with ``what`` it was, and read as absent."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError as exc:
        quarantine(path, what, f"not a file: {exc.strerror}")
        return None
    except OSError as exc:
        log.error(f"{what} unreadable; ignoring it", path=str(path), error=exc.strerror)
        return None
    try:
        return parse(raw)
    except (ValueError, StateFileError, KeyError, TypeError, AttributeError) as exc:
        quarantine(path, what, str(exc) or type(exc).__name__)
        return None


def quarantine(path: Path, what: str, why: str) -> Path | None:
    """Rename a damaged or foreign state file beside itself, for a human to look at; the
    agent goes on as if it were not there. Returns where it went (None if it could not)."""
    aside = path.with_name(f"{path.name}{CORRUPT_SUFFIX}{int(time.time())}")
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.error(f"{what} damaged and could not be moved aside", path=str(path), error=why,
                  move_error=exc.strerror)
        return None
    log.error(f"{what} damaged; moved aside", path=str(path), kept=str(aside), error=why)
    return aside


__all__ = ["StateFileError", "ensure_private_dir", "quarantine", "read_or_quarantine", "sync_directory", "write_atomic"]
