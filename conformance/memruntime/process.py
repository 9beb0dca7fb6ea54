"""Simulated container processes: a container's command is interpreted, not executed.

A container's ``command`` + ``args`` (or its image's entrypoint + cmd) becomes a program run by a
small interpreter, so that a pod behaves in the memory runtime as it would in containerd for the
commands tests use:

* ``sleep N`` (``infinity`` too), ``true``, ``false``, ``exit N``, ``echo X`` (written to the CRI log
  as the container's stdout; ``>&2`` to stderr; ``> file``/``>> file`` into its filesystem),
  ``cat``, ``test``/``[``, ``touch``, ``rm``, ``ls``, ``printenv``, ``env``, ``wait``, ``trap``;
* ``sh -c SCRIPT``: statements separated by ``;``, newlines, ``&&``, ``||``, ``&`` (a background
  job, which ``wait`` waits for), ``while``/``until ... do ... done`` and ``if ... then ... else ...
  fi``; ``$VAR`` and ``${VAR}`` expand from the container's environment;
* any other program is a server that runs until it is signalled (the "run forever" default).

Signals follow the kernel's rule for PID 1 of a PID namespace, which is what makes a container's
SIGTERM behaviour surprising: a signal whose default action would kill is *not* delivered to PID 1
unless PID 1 handles it. So ``sleep 3600`` as the container's process ignores SIGTERM and only
SIGKILL (StopContainer's timeout) ends it (exit 137); ``sh -c "trap 'exit 0' TERM; sleep 3600 &
wait"`` exits 0 at once; with ``trap ... TERM; sleep 3600`` (a foreground child) the trap runs only
after the child ends, as in a real shell. :class:`SigtermMode` can override this per runtime or
container (``exit``: every process dies of SIGTERM with 143, as a process that is not PID 1
would; ``ignore``: nothing but SIGKILL stops it).

Exit codes and reasons are containerd's: 0 is ``Completed``, anything else ``Error``, a process
killed by signal N exits 128+N, an OOM kill is ``OOMKilled`` (137).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import anyio
import anyio.abc

SigtermMode = Literal["pid1", "exit", "ignore"]
"""How a container's process takes SIGTERM: ``pid1`` (faithful: ignored unless the program
handles it), ``exit`` (dies of it: 143), ``ignore`` (only SIGKILL ends it)."""

SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15}
FOREVER = float("inf")


class ExitShell(Exception):
    """``exit N`` (or a trap's ``exit``): the program ends with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class FileSystem(Protocol):
    """What a program sees of its container's files (mounts resolved to host paths)."""

    def read(self, path: str) -> bytes | None: ...

    def write(self, path: str, data: bytes, append: bool = False) -> bool: ...

    def remove(self, path: str) -> bool: ...

    def kind(self, path: str) -> Literal["file", "dir", None]: ...

    def listing(self, path: str) -> list[str] | None: ...


class Output(Protocol):
    def write(self, stream: Literal["stdout", "stderr"], text: str) -> None: ...


# --- parsing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Simple:
    argv: tuple[str, ...]
    redirect: tuple[str, str] | None = None
    """(">" | ">>" | ">&2", target)"""
    background: bool = False


@dataclass(frozen=True)
class Loop:
    condition: tuple[tuple[str, Node], ...]
    body: tuple[tuple[str, Node], ...]
    until: bool = False


@dataclass(frozen=True)
class If:
    condition: tuple[tuple[str, Node], ...]
    then: tuple[tuple[str, Node], ...]
    otherwise: tuple[tuple[str, Node], ...] = ()


@dataclass(frozen=True)
class Background:
    """A compound statement run as an ``&`` job."""

    node: Loop | If


Node = Simple | Loop | If | Background
Script = tuple[tuple[str, Node], ...]
"""Statements, each with the operator that joins it to the one before (";", "&&", "||")."""

_OPERATORS = {";", "&&", "||", "&", "\n"}


def _tokens(script: str) -> list[str]:
    lexer = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=";&|>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out = []
    for token in lexer:
        # shlex joins runs of punctuation ("; ;", ">&2" comes as ">&" "2"): split them back.
        if token and all(ch in ";&|>" for ch in token) and token not in ("&&", "||", ">", ">>", ">&"):
            out.extend(re.findall(r"&&|\|\||>>|>&|[;&|>]", token))
        else:
            out.append(token)
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def statements(self, stop: frozenset[str] = frozenset()) -> Script:
        out: list[tuple[str, Node]] = []
        joiner = ";"
        while True:
            token = self.peek()
            if token is None or token in stop:
                return tuple(out)
            if token in (";", "&&", "||"):
                joiner = self.take()
                continue
            node = self.statement()
            if self.peek() == "&":
                self.take()
                if isinstance(node, Simple):
                    node = Simple(node.argv, node.redirect, background=True)
                elif isinstance(node, (Loop, If)):
                    node = Background(node)
            out.append((joiner, node))
            joiner = ";"

    def statement(self) -> Node:
        token = self.peek()
        if token in ("while", "until"):
            self.take()
            condition = self.statements(frozenset({"do"}))
            self.expect("do")
            body = self.statements(frozenset({"done"}))
            self.expect("done")
            return Loop(condition, body, until=token == "until")
        if token == "if":
            self.take()
            condition = self.statements(frozenset({"then"}))
            self.expect("then")
            then = self.statements(frozenset({"else", "fi"}))
            otherwise: Script = ()
            if self.peek() == "else":
                self.take()
                otherwise = self.statements(frozenset({"fi"}))
            self.expect("fi")
            return If(condition, then, otherwise)
        argv: list[str] = []
        redirect: tuple[str, str] | None = None
        while (token := self.peek()) is not None and token not in _OPERATORS:
            token = self.take()
            if token in (">", ">>") and self.peek() is not None:
                redirect = (token, self.take())
            elif token == ">&" and self.peek() == "2":
                self.take()
                redirect = (">&2", "")
            else:
                argv.append(token)
        return Simple(tuple(argv), redirect)

    def expect(self, word: str) -> None:
        if self.peek() != word:
            raise ValueError(f"expected {word!r}")
        self.take()


def parse(script: str) -> Script:
    """A shell script as statements; raises ValueError for what the interpreter cannot read."""
    return _Parser(_tokens(script)).statements()


# --- running ---------------------------------------------------------------------------------


@dataclass
class Context:
    """One running program: its environment, files, output and what it does with signals."""

    env: Mapping[str, str]
    files: FileSystem
    output: Output
    pid1: bool = True
    sigterm: SigtermMode = "pid1"
    traps: dict[int, str] = field(default_factory=dict)
    """Signal number → the trap's script ("" = ignored)."""
    pending: list[int] = field(default_factory=list)
    jobs: list[anyio.Event] = field(default_factory=list)
    in_child: bool = False
    """A foreground child runs: a trapped signal waits until it ends (the shell's rule)."""
    interruptible: anyio.Event = field(default_factory=anyio.Event)
    """Set when a signal arrives that the program must act on now."""
    exec_mode: bool = False
    """ExecSync: an unknown program is an error (127) instead of a server."""
    groups: list[anyio.abc.TaskGroup] = field(default_factory=list)
    """The running shells' task groups (innermost last): where ``&`` jobs run."""


Runner = Callable[[Sequence[str], Context], Awaitable[int]]


def expand(word: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), word)


async def run_script(script: Script, ctx: Context) -> int:
    status = 0
    for joiner, node in script:
        if joiner == "&&" and status != 0 or joiner == "||" and status == 0:
            continue
        status = await _run_node(node, ctx)
        await _deliver_pending(ctx)
    return status


async def _run_node(node: Node, ctx: Context) -> int:
    if isinstance(node, Background):
        done = anyio.Event()
        ctx.jobs.append(done)
        inner = node.node

        async def compound_job() -> None:
            try:
                await _run_node(inner, ctx)
            except ExitShell:
                pass
            finally:
                done.set()

        ctx.groups[-1].start_soon(compound_job)
        return 0
    if isinstance(node, Loop):
        status = 0
        while True:
            ok = await run_script(node.condition, ctx) == 0
            if ok == node.until:
                return status
            status = await run_script(node.body, ctx)
            await anyio.lowlevel.checkpoint()  # a loop without a sleep must not starve the runtime
    if isinstance(node, If):
        if await run_script(node.condition, ctx) == 0:
            return await run_script(node.then, ctx)
        return await run_script(node.otherwise, ctx)
    argv = [expand(a, ctx.env) for a in node.argv]
    if not argv:
        return 0
    if node.background:
        done = anyio.Event()
        ctx.jobs.append(done)

        async def job() -> None:
            try:
                await run_argv(argv, ctx, node.redirect, background=True)
            except ExitShell:
                pass  # a background job's exit ends the job only
            finally:
                done.set()

        ctx.groups[-1].start_soon(job)
        return 0
    return await run_argv(argv, ctx, node.redirect)


async def _deliver_pending(ctx: Context) -> None:
    while ctx.pending:
        signum = ctx.pending.pop(0)
        action = ctx.traps.get(signum)
        if action:
            await run_script(parse(action), ctx)


class _Redirected:
    def __init__(self, ctx: Context, redirect: tuple[str, str] | None) -> None:
        self.ctx, self.redirect = ctx, redirect

    def write(self, stream: Literal["stdout", "stderr"], text: str) -> None:
        if self.redirect is None:
            self.ctx.output.write(stream, text)
        elif self.redirect[0] == ">&2":
            self.ctx.output.write("stderr", text)
        elif stream == "stdout":
            self.ctx.files.write(self.redirect[1], text.encode(), append=self.redirect[0] == ">>")
        else:
            self.ctx.output.write(stream, text)


async def run_argv(argv: Sequence[str], ctx: Context, redirect: tuple[str, str] | None = None,
                   background: bool = False) -> int:
    """One program (a builtin, a shell, or the run-forever default); ``background``: an ``&``
    job, which a trapped signal does not wait for."""
    out = _Redirected(ctx, redirect)
    name = os.path.basename(argv[0])
    args = list(argv[1:])
    if redirect is not None and redirect[0] in (">", ">>") and name != "echo":
        ctx.files.write(redirect[1], b"", append=redirect[0] == ">>")
    if name in ("sh", "bash", "ash", "dash"):
        if args[:1] == ["-c"] and len(args) > 1:
            try:
                script = parse(args[1])
            except ValueError as exc:
                out.write("stderr", f"sh: syntax error: {exc}\n")
                return 2
            return await _shell(script, ctx)
        if ctx.exec_mode:
            return 0
        return await _serve(ctx)  # an interactive shell: reads stdin until signalled
    if name in ("true", ":"):
        return 0
    if name == "false":
        return 1
    if name == "exit":
        raise ExitShell(int(args[0]) if args and args[0].lstrip("-").isdigit() else 0)
    if name == "echo":
        newline = True
        if args[:1] == ["-n"]:
            newline, args = False, args[1:]
        text = " ".join(args) + ("\n" if newline else "")
        if redirect is not None and redirect[0] in (">", ">>"):
            ctx.files.write(redirect[1], text.encode(), append=redirect[0] == ">>")
        else:
            out.write("stdout", text)
        return 0
    if name == "sleep":
        return await _sleep(args, ctx, foreground=not background)
    if name == "wait":
        for job in list(ctx.jobs):
            await _interruptible(ctx, job.wait())
        return 0
    if name == "trap":
        _trap(args, ctx)
        return 0
    if name == "cat":
        status = 0
        for path in args:
            data = ctx.files.read(path)
            if data is None:
                out.write("stderr", f"cat: can't open '{path}': No such file or directory\n")
                status = 1
            else:
                out.write("stdout", data.decode(errors="replace"))
        if not args and not ctx.exec_mode:
            return await _serve(ctx)  # cat of an open stdin
        return status
    if name in ("test", "["):
        return _test([a for a in args if a != "]"], ctx)
    if name == "touch":
        for path in args:
            if ctx.files.read(path) is None:
                ctx.files.write(path, b"")
        return 0
    if name == "rm":
        paths = [a for a in args if not a.startswith("-")]
        force = any(a.startswith("-") and "f" in a for a in args)
        missing = [p for p in paths if not ctx.files.remove(p)]
        return 1 if missing and not force else 0
    if name == "ls":
        status = 0
        for path in args or ["."]:
            entries = ctx.files.listing(path)
            if entries is None:
                out.write("stderr", f"ls: {path}: No such file or directory\n")
                status = 1
            else:
                out.write("stdout", "".join(f"{e}\n" for e in entries))
        return status
    if name in ("printenv", "env"):
        if name == "printenv" and args:
            values = [ctx.env[a] for a in args if a in ctx.env]
            out.write("stdout", "".join(f"{v}\n" for v in values))
            return 0 if len(values) == len(args) else 1
        out.write("stdout", "".join(f"{k}={v}\n" for k, v in ctx.env.items()))
        return 0
    if name in ("pause",):
        ctx.traps.setdefault(SIGNALS["TERM"], "exit 0")
        ctx.traps.setdefault(SIGNALS["INT"], "exit 0")
        return await _serve(ctx)
    if ctx.exec_mode:
        out.write("stderr", f"sh: {name}: not found\n")
        return 127
    return await _serve(ctx)


async def _shell(script: Script, ctx: Context) -> int:
    status = 0
    async with anyio.create_task_group() as tg:
        ctx.groups.append(tg)
        try:
            status = await run_script(script, ctx)
        except ExitShell as exc:
            status = exc.code
        finally:
            ctx.groups.pop()
            tg.cancel_scope.cancel()  # the shell's background jobs die with it (as in a container)
    return status


async def _sleep(args: list[str], ctx: Context, foreground: bool = True) -> int:
    seconds = 0.0
    for arg in args:
        if arg == "infinity":
            seconds = FOREVER
            break
        match = re.fullmatch(r"(\d+(?:\.\d*)?)([smhd]?)", arg)
        if match is None:
            return 1
        seconds += float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    ctx.in_child = ctx.in_child or foreground
    try:
        if seconds == FOREVER:
            await anyio.sleep_forever()
        else:
            await anyio.sleep(seconds)
    finally:
        if foreground:
            ctx.in_child = False
    return 0


async def _serve(ctx: Context) -> int:
    await _interruptible(ctx, anyio.sleep_forever())
    return 0


async def _interruptible(ctx: Context, wait: Awaitable[object]) -> None:
    """``wait`` (a builtin's wait), cut short when a trapped signal arrives: the trap runs."""
    ctx.interruptible = anyio.Event()
    async with anyio.create_task_group() as tg:
        async def waiter() -> None:
            await wait
            tg.cancel_scope.cancel()

        async def signalled() -> None:
            await ctx.interruptible.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(waiter)
        tg.start_soon(signalled)
    await _deliver_pending(ctx)


def _trap(args: list[str], ctx: Context) -> None:
    if not args:
        return
    action, names = args[0], args[1:]
    for name in names:
        signum = SIGNALS.get(name.upper().removeprefix("SIG"), int(name) if name.isdigit() else 0)
        if signum in (0, SIGNALS["KILL"]):
            continue
        if action == "-":
            ctx.traps.pop(signum, None)
        else:
            ctx.traps[signum] = action


def _test(args: list[str], ctx: Context) -> int:
    negate = args[:1] == ["!"]
    if negate:
        args = args[1:]
    result = False
    if len(args) == 2 and args[0] in ("-e", "-f", "-d", "-s"):
        kind = ctx.files.kind(args[1])
        result = {"-e": kind is not None, "-f": kind == "file", "-d": kind == "dir",
                  "-s": kind == "file" and bool(ctx.files.read(args[1]))}[args[0]]
    elif len(args) == 3 and args[1] in ("=", "==", "!="):
        result = (args[0] == args[2]) != (args[1] == "!=")
    elif len(args) == 3 and args[1] in ("-eq", "-ne", "-lt", "-gt", "-le", "-ge"):
        try:
            a, b = int(args[0]), int(args[2])
        except ValueError:
            return 2
        result = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-gt": a > b, "-le": a <= b, "-ge": a >= b}[args[1]]
    elif len(args) == 2 and args[0] in ("-n", "-z"):
        result = bool(args[1]) == (args[0] == "-n")
    elif len(args) == 1:
        result = bool(args[0])
    return 0 if result != negate else 1


# --- a container's main process ---------------------------------------------------------------


@dataclass
class Exit:
    code: int
    reason: str
    message: str = ""


def reason_for(code: int) -> str:
    """containerd's reason for an exit code (OOM kills are reported by the caller)."""
    return "Completed" if code == 0 else "Error"


class Process:
    """The main process of one container: runs its program, takes signals, reports its exit."""

    def __init__(self, argv: Sequence[str], ctx: Context) -> None:
        self.argv = tuple(argv)
        self.ctx = ctx
        self.exited = anyio.Event()
        self.exit: Exit | None = None
        self._scope: anyio.CancelScope | None = None
        self._forced: Exit | None = None

    async def run(self, on_exit: Callable[[Exit], None]) -> None:
        code = 0
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self._forced is None:
                async with anyio.create_task_group() as tg:
                    self.ctx.groups.append(tg)
                    try:
                        code = await run_argv(self.argv, self.ctx) if self.argv else 0
                    except ExitShell as exc:
                        code = exc.code
                    finally:
                        tg.cancel_scope.cancel()
        self.exit = self._forced or Exit(code, reason_for(code))
        on_exit(self.exit)
        self.exited.set()

    def signal(self, signum: int) -> None:
        """Deliver ``signum`` as the kernel would to PID 1 (see the module docstring)."""
        if self.exited.is_set():
            return
        if signum == SIGNALS["KILL"]:
            self.kill(128 + signum)
            return
        handled = signum in self.ctx.traps
        if handled:
            if self.ctx.traps[signum] == "":
                return  # trap '' SIG: ignored
            self.ctx.pending.append(signum)
            if not self.ctx.in_child:
                self.ctx.interruptible.set()
            return
        mode = self.ctx.sigterm
        if mode == "ignore" or (mode == "pid1" and self.ctx.pid1):
            return  # the kernel does not deliver a default-action signal to PID 1
        self.kill(128 + signum)

    def kill(self, code: int, reason: str = "", message: str = "") -> None:
        """End the process now (SIGKILL, an OOM kill, or a test's ``exit``)."""
        if self.exited.is_set() or self._forced is not None:
            return
        self._forced = Exit(code, reason or reason_for(code), message)
        if self._scope is not None:
            self._scope.cancel()


def default_argv(entrypoint: Sequence[str], cmd: Sequence[str], command: Sequence[str],
                 args: Sequence[str]) -> list[str]:
    """The OCI rule the runtime applies: command replaces the entrypoint (and drops its cmd),
    args replace the cmd."""
    if command:
        return [*command, *args]
    return [*entrypoint, *(args or cmd)]


def host_path_kind(path: Path) -> Literal["file", "dir", None]:
    if path.is_dir():
        return "dir"
    if path.exists():
        return "file"
    return None


__all__ = ["Context", "Exit", "ExitShell", "FileSystem", "Output", "Process", "SIGNALS", "SigtermMode",
           "default_argv", "parse", "reason_for", "run_argv", "run_script"]
