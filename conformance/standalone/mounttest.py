"""``agnhost mounttest`` in busybox shell (conformance.md section 11.0).

The storage tests run agnhost's mounttest, which prints one line per flag. Each function here
returns the shell that prints the same line with busybox applets, so a ported case keeps
upstream's expected strings unchanged. mounttest runs ``umask(0)`` first and creates files with
an exact mode; :func:`new_file` does the same with a subshell ``umask``.
"""

from __future__ import annotations

import shlex

CONTENT = "mount-tester new file"


def _q(path: str) -> str:
    return shlex.quote(path)


def fs_type(path: str) -> str:
    """--fs_type: ``mount type of "<p>": tmpfs`` (busybox stat names the statfs magic)."""
    return f'echo "mount type of \\"{path}\\": $(stat -f -c %T {_q(path)})"; '


def new_file(path: str, mode: int) -> str:
    """--new_file_0644 and friends: write the file with exactly that mode, then print its
    content as mounttest does after creating it."""
    umask = 0o777 & ~mode
    return f"(umask {umask:03o}; echo '{CONTENT}' > {_q(path)}) && chmod {mode:o} {_q(path)}; " + file_content(path)


# Octal permission bits to Go's FileMode.Perm().String(): the low nine bits as rwx, after a
# leading "-" whatever the file type (sticky and setgid bits are not part of Perm()).
_PERM_AWK = ("awk '{m=substr(sprintf(\"%04d\",$1),2);s=\"-\";"
             "for(i=1;i<=3;i++){d=substr(m,i,1)+0;"
             "s=s (d>=4?\"r\":\"-\") (d%4>=2?\"w\":\"-\") (d%2?\"x\":\"-\")}print s}'")


def file_perm(path: str) -> str:
    """--file_perm: Go's ``FileMode.Perm().String()``, e.g. ``-rwxrwxrwx`` for a 1777 directory."""
    return f'echo "perms of file \\"{path}\\": $(stat -c %a {_q(path)} | {_PERM_AWK})"; '


def file_mode(path: str) -> str:
    """--file_mode for a regular file: Go's ``FileMode.String()`` is ``ls -l`` style there."""
    return f'echo "mode of file \\"{path}\\": $(stat -c %A {_q(path)})"; '


def file_content(path: str) -> str:
    """--file_content."""
    return f'echo "content of file \\"{path}\\": $(cat {_q(path)})"; '


def file_content_in_loop(path: str, retry_time: int = 180) -> str:
    """--file_content_in_loop with --retry_time (break_on_expected_content: stop once read):
    retry every 2 s; exit 1 when the time is up (mounttest's error exit)."""
    return (f"end=$(( $(date +%s) + {retry_time} )); "
            f"while [ $(date +%s) -lt $end ]; do "
            f"if [ -r {_q(path)} ]; then {file_content(path)}exit 0; fi; "
            f'echo "Error reading file {path}: not there yet, retrying"; sleep 2; done; exit 1')


def script(*parts: str) -> list[str]:
    """The container command running the given mounttest steps, failing on the first error."""
    return ["sh", "-c", "set -e; umask 0; " + "".join(parts)]


__all__ = ["CONTENT", "file_content", "file_content_in_loop", "file_mode", "file_perm", "fs_type", "new_file",
           "script"]
