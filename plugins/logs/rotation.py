"""Size-based rotation of one container's log file, the kubelet's container log manager
(pkg/kubelet/logs/container_log_manager.go): the same file names, order of steps and limits.

For a live file ``<n>.log`` over the size limit:

1. drop leftovers of an interrupted earlier rotation (``*.tmp``; an uncompressed file whose
   ``.gz`` twin exists);
2. delete the oldest rotated files so that at most ``maxFiles - 2`` remain (the live file and
   the one rotated now make up the rest);
3. gzip every rotated file that is not compressed yet;
4. rename the live file to ``<n>.log.<YYYYMMDD-hhmmss>`` (left uncompressed: the runtime and
   log shippers may still be reading it) and have the runtime reopen ``<n>.log``.

Steps 1-3 and the rename are plain file operations (run in a worker thread); the reopen is a
CRI call made by the caller.
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path

# Go's "20060102-150405", the kubelet's timestampFormat for rotated files.
TIMESTAMP_FORMAT = "%Y%m%d-%H%M%S"
COMPRESS_SUFFIX = ".gz"
TMP_SUFFIX = ".tmp"


def rotated_files(log: Path) -> list[Path]:
    """``<log>.*``, oldest first (the timestamps sort as strings, like Go's sort.Strings)."""
    prefix = log.name + "."
    try:
        names = os.listdir(log.parent)
    except FileNotFoundError:
        return []
    return [log.parent / n for n in sorted(names) if n.startswith(prefix)]


def _in_use(path: Path, all_names: set[str]) -> bool:
    if path.name.endswith(TMP_SUFFIX):
        return False
    if path.name.endswith(COMPRESS_SUFFIX):
        return True
    # Compressed already but not yet removed when the last rotation was interrupted.
    return path.name + COMPRESS_SUFFIX not in all_names


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def compress(path: Path) -> Path:
    """``path`` → ``path.gz`` through a temporary file, so a crash never leaves a truncated
    ``.gz`` that would be taken for a finished one."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(path, "rb") as src, open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(tmp, 0o644)
    done = path.with_name(path.name + COMPRESS_SUFFIX)
    os.rename(tmp, done)
    _remove(path)
    return done


def prepare(log: Path, max_files: int) -> list[Path]:
    """Steps 1-3 for ``log``; returns the rotated files that remain (all compressed)."""
    logs = rotated_files(log)
    names = {p.name for p in logs}
    kept = []
    for path in logs:
        if _in_use(path, names):
            kept.append(path)
        else:
            _remove(path)
    keep = max(max_files - 2, 0)
    excess = len(kept) - keep
    for path in kept[:max(excess, 0)]:
        _remove(path)  # oldest first, so a reader of newer files is not disturbed
    kept = kept[max(excess, 0):]
    return [p if p.name.endswith(COMPRESS_SUFFIX) else compress(p) for p in kept]


def rotated_name(log: Path, now: float) -> Path:
    return log.with_name(f"{log.name}.{time.strftime(TIMESTAMP_FORMAT, time.localtime(now))}")


__all__ = ["COMPRESS_SUFFIX", "TIMESTAMP_FORMAT", "compress", "prepare", "rotated_files", "rotated_name"]
