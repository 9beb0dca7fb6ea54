"""A safe loader for manifest files: YAML (and so JSON) into JSON-compatible values, bounded.

A manifest directory is input from whoever can write a file there, so the loader treats it as
hostile: it never constructs anything but strings, 64-bit integers, finite floats, booleans,
null, string-keyed mappings and sequences, and it refuses a file before it can cost more than a
file of the size limit would:

* the text is at most ``max_bytes``, at most ``max_documents`` documents;
* nesting is at most ``max_depth`` deep (the composer here is iterative: no recursion in Python
  or in the C extension, whatever the depth of the input);
* aliases are at most ``max_aliases``, and the document as it would be with every alias
  expanded has at most ``max_nodes`` nodes and ``max_bytes`` of scalar text — a "billion
  laughs" is refused after a few kilobytes, before anything is expanded;
* explicit tags other than the JSON ones (``!!binary``, ``!!timestamp``, ``!!set``,
  ``!!python/object``, local ``!tags``) are refused; an untagged scalar that YAML 1.1 would
  read as a timestamp stays the string it was written as (Go's YAML-to-JSON conversion, which the
  kubelet uses, does the same), so ``status.startTime: 2024-01-01T00:00:00Z`` is just text;
* mapping keys must be strings (``1: x``, ``true: x``, ``[a]: x`` are refused with the path),
  a key may not repeat, and ``<<`` merges work as in YAML 1.1 (the merged content counts
  against the bounds like an alias).

PyYAML's C parser (libyaml) produces the events when it is available, the pure-Python one
otherwise; the bounds are enforced here, on the events, so they hold with either. A file that
is one JSON object is read as JSON (as the kubelet's ``yaml.ToJSON`` passes JSON through): YAML
1.1 has no surrogate pairs, so ``"\ud83d\ude00"`` (how Python's json writes an emoji) would
otherwise be refused. The same bounds apply to it, and its errors have no line and column.

Errors name the file, the line and column, the field path and what is wrong; they never quote
the manifest's text (a secret in an env value must not leak through an error message).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml import events as yev
from yaml.resolver import Resolver

try:
    from yaml import CSafeLoader as _CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None
HAVE_C_PARSER = _CParser is not None

MAX_MANIFEST_BYTES = 10 * 1024 * 1024  # the kubelet's limit per file (maxConfigLength)
MAX_JSON_BYTES = 1024 * 1024
"""Larger JSON files take the YAML path, which checks the bounds while it reads (json.loads
would build the whole tree first)."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = MAX_MANIFEST_BYTES
    max_documents: int = 100
    max_depth: int = 64
    max_nodes: int = 200_000
    max_aliases: int = 1_000


DEFAULT_LIMITS = Limits()


class ManifestError(Exception):
    """A manifest that cannot be turned into objects. ``reason`` is machine-readable
    (ManifestMalformed, ManifestTooLarge, ManifestInvalid, UnsupportedKind, ...); the message
    names the file and where, never the file's content."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


Position = tuple[int, int]
"""(line, column), both from 1."""


@dataclass
class Document:
    value: Any
    index: int
    """0-based position of the document in its file."""
    positions: dict[tuple[str | int, ...], Position] = field(default_factory=dict)
    """Where each node starts, by its path in ``value`` (mapping keys and list indexes)."""
    json_text: str | None = None
    """A document read as JSON has no positions until one is asked for (errors only): then its
    text is composed again as YAML, which JSON almost always is, for them."""
    first_line: int = 1

    def position(self, path: tuple[str | int, ...]) -> Position | None:
        """The position of ``path``, else of its nearest ancestor that has one (content that
        came through an alias or a merge has the position of the alias)."""
        if self.json_text is not None:
            self.positions = _json_positions(self.json_text, self.first_line)
            self.json_text = None
        while True:
            found = self.positions.get(path)
            if found is not None or not path:
                return found
            path = path[:-1]


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
_VALUE = "tag:yaml.org,2002:value"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = frozenset({_STR, _INT, _FLOAT, _BOOL, _NULL})

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
# Quoted parts of PyYAML's problem texts can be the manifest's own characters; token names
# such as '<block mapping start>' are kept.
_QUOTED = re.compile(r"\s*'[^']*'|\s*\"[^\"]*\"")

_resolver = Resolver()
_constructor = yaml.constructor.SafeConstructor()


class _Merge:
    """The ``<<`` key (YAML 1.1 merge)."""


_MERGE_KEY = _Merge()


@dataclass
class _Frame:
    kind: str  # "map" or "seq"
    value: Any
    path: tuple[str | int, ...]
    anchor: str | None
    nodes: int = 1
    size: int = 0
    key: Any = None
    key_mark: Any = None
    has_key: bool = False
    merges: list[dict[str, Any]] = field(default_factory=list)


def describe(source: str, document: int, position: Position | None) -> str:
    """``file (document 2): line 3, column 5``, as much of it as is known (the first document
    is not numbered)."""
    where = source + (f" (document {document + 1})" if document > 0 else "")
    if position is not None:
        where += f": line {position[0]}, column {position[1]}"
    return where


def load(data: bytes | str, source: str, limits: Limits = DEFAULT_LIMITS, *,
         pure_python: bool = False) -> list[Document]:
    """Every non-empty document of one file; raises ManifestError. ``pure_python`` parses with
    PyYAML's Python parser even where libyaml is available (the tests run both)."""
    if len(data) > limits.max_bytes:
        raise ManifestError("ManifestTooLarge",
                            f"{source}: {len(data)} bytes is over the {limits.max_bytes // 2**20} MiB limit")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ManifestError("ManifestMalformed",
                                f"{source}: line {line}: not valid UTF-8 (byte {exc.start})") from None
    else:
        text = data
    if len(text) <= MAX_JSON_BYTES and text.lstrip().startswith("{"):
        docs = _json_documents(text, source, limits)
        if docs is not None:
            return docs
    parser = yaml.SafeLoader if pure_python or _CParser is None else _CParser
    return _Composer(source, limits).documents(parser(text))


_NOT_JSON = object()
_DOCUMENT_SEPARATOR = re.compile(r"^---[ \t]*$", re.MULTILINE)


def _json_documents(text: str, source: str, limits: Limits) -> list[Document] | None:
    """JSON objects, one per document (``---`` lines between them, as YAML streams have), or
    None when any of them is not plain JSON."""
    chunks: list[tuple[str, int]] = []  # (text, its first line in the file)
    start = 0
    for separator in [*_DOCUMENT_SEPARATOR.finditer(text), None]:
        end = separator.start() if separator is not None else len(text)
        if text[start:end].strip():
            chunks.append((text[start:end], text.count("\n", 0, start) + 1))
        start = separator.end() if separator is not None else end
    if len(chunks) > limits.max_documents:
        raise ManifestError("ManifestTooLarge", f"{source}: more than {limits.max_documents} documents")
    if not all(c.lstrip().startswith("{") for c, _ in chunks):
        return None
    docs = []
    for i, (chunk, first_line) in enumerate(chunks):
        value = _json(chunk, describe(source, i, None), limits)
        if value is _NOT_JSON:
            return None
        docs.append(Document(value=value, index=i, json_text=chunk, first_line=first_line))
    return docs


def _json_positions(text: str, first_line: int) -> dict[tuple[str | int, ...], Position]:
    try:
        parser = yaml.SafeLoader if _CParser is None else _CParser
        [doc] = _Composer("", DEFAULT_LIMITS).documents(parser(text))
    except (ManifestError, ValueError):
        return {}  # not YAML after all (a surrogate pair): no positions, the path still says where
    return {path: (line + first_line - 1, column) for path, (line, column) in doc.positions.items()}


class _DuplicateKey(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _json(text: str, source: str, limits: Limits) -> Any:
    """One JSON document, or _NOT_JSON when the text is not plain JSON (several documents, YAML
    flow style): the YAML path decides then."""
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except json.JSONDecodeError:
        return _NOT_JSON
    except _DuplicateKey as exc:
        raise ManifestError("ManifestInvalid", f"{source}: duplicate key {json.dumps(_cut(str(exc)))}") from None
    except ValueError:
        raise ManifestError("ManifestInvalid", f"{source}: a number must be finite (no NaN or Infinity)") from None
    except RecursionError:
        raise ManifestError("ManifestTooLarge", f"{source}: nested more than {limits.max_depth} levels deep") from None
    _check_tree(value, source, limits)
    return value


def _check_tree(value: Any, source: str, limits: Limits) -> None:
    """The loader's bounds and value rules over a decoded JSON tree (iteratively)."""
    nodes = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise ManifestError("ManifestTooLarge", f"{source}: more than {limits.max_nodes} nodes")
        if len(path) > limits.max_depth:
            raise ManifestError("ManifestTooLarge", f"{source}: nested more than {limits.max_depth} levels deep")
        where = f"{source}: {_render_path(path)}" if path else source
        if isinstance(item, dict):
            for k, v in item.items():
                if _SURROGATE.search(k):
                    raise ManifestError("ManifestInvalid", f"{where}: a key holds an invalid Unicode character")
                stack.append((v, (*path, k)))
        elif isinstance(item, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(item))
        elif isinstance(item, str) and _SURROGATE.search(item):
            raise ManifestError("ManifestInvalid",
                                f"{where}: a string holds an invalid Unicode character (a lone surrogate)")
        elif isinstance(item, int) and not isinstance(item, bool) and not _INT64_MIN <= item <= _INT64_MAX:
            raise ManifestError("ManifestInvalid", f"{where}: integer out of range (it must fit in 64 bits)")


def _cut(text: str) -> str:
    return text if len(text) <= 64 else text[:64] + "..."


class _Composer:
    """Events to values, iteratively, with the bounds checked at every event."""

    def __init__(self, source: str, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        self.nodes = 0
        self.size = 0
        self.aliases = 0
        self.docs: list[Document] = []

    # --- errors ----------------------------------------------------------------------

    def _fail(self, reason: str, what: str, mark: Any = None, path: tuple[str | int, ...] | None = None) -> None:
        position = (mark.line + 1, mark.column + 1) if mark is not None else None
        where = describe(self.source, max(len(self.docs) - 1, 0), position)
        if path:
            where += f": {_render_path(path)}"
        raise ManifestError(reason, f"{where}: {what}")

    # --- the event loop --------------------------------------------------------------

    def documents(self, parser: Any) -> list[Document]:
        try:
            for event in self._events(parser):
                if isinstance(event, yev.DocumentStartEvent):
                    self._document(parser)
        finally:
            parser.dispose()
        return [d for d in self.docs if d.value is not None]

    def _events(self, parser: Any) -> Iterator[Any]:
        try:
            while parser.check_event():
                yield parser.get_event()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = _QUOTED.sub(_redact, exc.problem or exc.context or "syntax error")
            self._fail("ManifestMalformed", f"not valid YAML or JSON: {problem}", mark)
        except yaml.YAMLError:
            self._fail("ManifestMalformed", "not valid YAML or JSON")

    def _document(self, parser: Any) -> None:
        if len(self.docs) >= self.limits.max_documents:
            self._fail("ManifestTooLarge", f"more than {self.limits.max_documents} documents")
        doc = Document(value=None, index=len(self.docs))
        self.docs.append(doc)
        anchors: dict[str, tuple[Any, int, int]] = {}
        stack: list[_Frame] = []
        for event in self._events(parser):
            if isinstance(event, yev.DocumentEndEvent):
                return
            if isinstance(event, (yev.MappingStartEvent, yev.SequenceStartEvent)):
                kind = "map" if isinstance(event, yev.MappingStartEvent) else "seq"
                self._check_tag(event.tag, _MAP if kind == "map" else _SEQ, event.start_mark,
                                self._child_path(stack))
                if len(stack) >= self.limits.max_depth:
                    self._fail("ManifestTooLarge", f"nested more than {self.limits.max_depth} levels deep",
                               event.start_mark)
                self._count(1, 0, event.start_mark)
                path = self._child_path(stack)
                if not stack or stack[-1].kind == "seq" or stack[-1].has_key:
                    doc.positions[path] = (event.start_mark.line + 1, event.start_mark.column + 1)
                stack.append(_Frame(kind, {} if kind == "map" else [], path, event.anchor))
                continue
            if isinstance(event, (yev.MappingEndEvent, yev.SequenceEndEvent)):
                frame = stack.pop()
                value = frame.value
                if frame.kind == "map" and frame.merges:
                    merged: dict[str, Any] = {}
                    for source_map in frame.merges:  # earlier sources win over later ones
                        for k, v in source_map.items():
                            merged.setdefault(k, v)
                    merged.update(value)  # the mapping's own keys win over merged ones
                    value = frame.value = merged
                if frame.anchor is not None:
                    anchors[frame.anchor] = (value, frame.nodes, frame.size)
                self._add(stack, doc, value, frame.nodes, frame.size, event.start_mark)
                continue
            if isinstance(event, yev.ScalarEvent):
                value = self._scalar(event, stack)
                size = len(event.value)
                self._count(1, size, event.start_mark)
                if event.anchor is not None:
                    anchors[event.anchor] = (value, 1, size)
                if not stack or stack[-1].kind == "seq" or stack[-1].has_key:
                    doc.positions[self._child_path(stack)] = (event.start_mark.line + 1, event.start_mark.column + 1)
                self._add(stack, doc, value, 1, size, event.start_mark)
                continue
            if isinstance(event, yev.AliasEvent):
                found = anchors.get(event.anchor)
                if found is None:
                    # Unknown, or an alias inside the node its anchor names (a recursive alias).
                    self._fail("ManifestMalformed", "alias to an unknown or enclosing anchor", event.start_mark,
                               self._child_path(stack))
                self.aliases += 1
                if self.aliases > self.limits.max_aliases:
                    self._fail("ManifestTooLarge", f"more than {self.limits.max_aliases} aliases", event.start_mark)
                value, nodes, size = found  # type: ignore[misc]
                self._count(nodes, size, event.start_mark)
                if not stack or stack[-1].kind == "seq" or stack[-1].has_key:
                    doc.positions[self._child_path(stack)] = (event.start_mark.line + 1, event.start_mark.column + 1)
                # A copy: the result is a tree, like JSON (the bounds above keep the copy small).
                self._add(stack, doc, copy.deepcopy(value), nodes, size, event.start_mark)
                continue

    # --- bounds ----------------------------------------------------------------------

    def _count(self, nodes: int, size: int, mark: Any) -> None:
        self.nodes += nodes
        self.size += size
        if self.nodes > self.limits.max_nodes:
            self._fail("ManifestTooLarge",
                       f"more than {self.limits.max_nodes} nodes (with every alias expanded)", mark)
        if self.size > self.limits.max_bytes:
            self._fail("ManifestTooLarge",
                       f"more than {self.limits.max_bytes} bytes of text (with every alias expanded)", mark)

    # --- building values -------------------------------------------------------------

    @staticmethod
    def _child_path(stack: list[_Frame]) -> tuple[str | int, ...]:
        if not stack:
            return ()
        top = stack[-1]
        if top.kind == "seq":
            return (*top.path, len(top.value))
        if top.has_key and isinstance(top.key, str):
            return (*top.path, top.key)
        return top.path

    def _add(self, stack: list[_Frame], doc: Document, value: Any, nodes: int, size: int, mark: Any) -> None:
        if not stack:
            doc.value = value
            return
        top = stack[-1]
        top.nodes += nodes
        top.size += size
        if top.kind == "seq":
            top.value.append(value)
            return
        if not top.has_key:
            if value is _MERGE_KEY:
                pass
            elif not isinstance(value, str):
                self._fail("ManifestInvalid", f"a mapping key must be a string, not {describe_kind(value)}", mark,
                           top.path)
            elif value in top.value:
                self._fail("ManifestInvalid", "duplicate key", mark, (*top.path, value))
            top.key, top.key_mark, top.has_key = value, mark, True
            return
        key = top.key
        top.key, top.has_key = None, False
        if key is _MERGE_KEY:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                self._fail("ManifestInvalid", "a merge (<<) needs a mapping or a list of mappings", mark, top.path)
            top.merges.extend(sources)
            return
        top.value[key] = value

    def _check_tag(self, tag: str | None, wanted: str, mark: Any, path: tuple[str | int, ...]) -> None:
        if tag is None or tag == "!" or tag == wanted:
            return
        self._fail("ManifestInvalid", f"the tag {_tag_name(tag)} is not allowed here (only JSON-compatible values: "
                   "strings, numbers, booleans, null, mappings and sequences)", mark, path)

    def _scalar(self, event: Any, stack: list[_Frame]) -> Any:
        path = self._child_path(stack)
        text: str = event.value
        tag = event.tag
        explicit = tag is not None and tag != "!"
        if not explicit:
            tag = _resolver.resolve(yaml.ScalarNode, text, event.implicit)
        if _SURROGATE.search(text):
            self._fail("ManifestInvalid", "a string holds an invalid Unicode character (a lone surrogate)",
                       event.start_mark, path)
        if tag == _STR:
            return text
        if not explicit:
            if tag == _TIMESTAMP or tag == _VALUE:
                return text  # as Go's YAML-to-JSON conversion: the text, not a date
            if tag == _MERGE:
                in_key_position = bool(stack) and stack[-1].kind == "map" and not stack[-1].has_key
                return _MERGE_KEY if in_key_position else text
        if tag not in _SCALAR_TAGS:
            self._check_tag(tag, _STR, event.start_mark, path)
        node = yaml.ScalarNode(tag, text, event.start_mark, event.end_mark)
        try:
            if tag == _NULL:
                return None
            if tag == _BOOL:
                return _constructor.construct_yaml_bool(node)
            if tag == _INT:
                number = _constructor.construct_yaml_int(node)
                if not _INT64_MIN <= number <= _INT64_MAX:
                    self._fail("ManifestInvalid", "integer out of range (it must fit in 64 bits)", event.start_mark,
                               path)
                return number
            number = _constructor.construct_yaml_float(node)
        except ManifestError:
            raise
        except Exception:  # noqa: BLE001 - ValueError and friends from a malformed explicitly tagged scalar
            self._fail("ManifestInvalid", f"not a valid {_tag_name(tag)}", event.start_mark, path)
        if not math.isfinite(number):
            self._fail("ManifestInvalid", "a number must be finite (no .inf or .nan in JSON)", event.start_mark, path)
        return number


def _redact(match: re.Match[str]) -> str:
    """A quoted part of a parser message: kept when it is one character (',') or a token name
    ('<block end>'), dropped when it could be a piece of the manifest."""
    quoted = match.group(0)
    inner = quoted.strip()[1:-1]
    return quoted if len(inner) <= 1 or (inner.startswith("<") and inner.endswith(">")) else ""


def describe_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a sequence"
    return type(value).__name__


def _tag_name(tag: str) -> str:
    if tag.startswith("tag:yaml.org,2002:"):
        return "!!" + tag.removeprefix("tag:yaml.org,2002:")
    return tag if len(tag) <= 64 else tag[:64] + "..."


def _render_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            shown = json.dumps(p if len(p) <= 64 else p[:64] + "...")[1:-1]  # escaped: no control characters
            out += f".{shown}" if out else shown
    return out
