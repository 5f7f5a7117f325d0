# long module: one job, YAML text to plain data located value by value (libyaml or PyYAML)
"""YAML source documents: loaded with the line and column of every key and value.

A `SourceDocument` holds plain Python data (dicts, lists, scalars) as PyYAML's safe loader
builds it, plus an index from each value's path (`("changes", 1, "registry", "host")`) to
where its key and its value start in the file. Validating the data against a pydantic model
turns every problem pydantic finds into an `InputError` located at file:line:column, so a
user sees all problems of a file at once, each where it is (worded by rollout.inputs.fieldproblems).

Hostile input is refused with a located message, never a traceback or a hang (the limits are
listed in docs/input-contract.md):
- only regular files are read (no FIFOs, devices or sockets), at most `MAX_INPUT_BYTES`;
- control characters (a NUL byte, an escape) are refused at their line and column;
- nesting deeper than `MAX_DEPTH` levels is refused while composing, before Python's own
  recursion limit is reached;
- YAML aliases are expanded at every use, so a few lines can stand for 10^9 values ("billion
  laughs"): the document's size *after* expansion is measured on the composed node graph
  (linear in the file) and refused above `max_values` (`MAX_VALUES` unless the reader names a
  smaller limit, as plans do), as is an alias that contains itself. Values are also counted
  while composing, so a file of many small values stops at the limit, not at its end (PyYAML
  composes about 25,000 values a second).

Two deliberate departures from PyYAML's YAML 1.1 behaviour:
- a key repeated in one mapping is an error (YAML parsers silently keep the last one, which
  hides a half-edited plan);
- `22:00` is the string "22:00", not the base-60 integer 1320 that YAML 1.1 makes of it.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from rollout.errors import InputError, InputErrors, SourceLocation
from rollout.inputs.fieldproblems import (
    FieldProblem,
    PathPart,
    allowed_keys,
    describe_problem,
    describe_value,
    did_you_mean,
    format_path,
    shorten,
    sort_errors,
)
from rollout.inputs.inputfile import MAX_INPUT_BYTES, input_name, read_text
from rollout.inputs.yamllimits import (
    MAX_DEPTH,
    MAX_VALUES,
    VALUES_HINT,
    check_characters,
    measure_expansion,
    too_many_values,
)
from rollout.inputs.yamllines import BlockReader, NotPlain

ValuePath = tuple[PathPart, ...]
ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class Position:
    """A 1-based line and column in a source file."""

    line: int
    column: int


@dataclass(frozen=True)
class NodeMarks:
    """Where a value starts, and where its key starts when it is a mapping value."""

    value: Position
    key: Position | None = None


def _without_sexagesimal(
    resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]],
) -> dict[str | None, list[tuple[str, re.Pattern[str]]]]:
    """PyYAML's implicit resolvers minus YAML 1.1 base-60 numbers (`22:00` stays a string)."""
    int_pattern = re.compile(
        r"""^(?:[-+]?0b[0-1_]+
            |[-+]?0[0-7_]+
            |[-+]?(?:0|[1-9][0-9_]*)
            |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    )
    float_pattern = re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
            |\.[0-9_]+(?:[eE][-+][0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
        re.X,
    )
    replaced: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}
    for first, entries in resolvers.items():
        new_entries: list[tuple[str, re.Pattern[str]]] = []
        for tag, pattern in entries:
            if tag == "tag:yaml.org,2002:int":
                pattern = int_pattern
            elif tag == "tag:yaml.org,2002:float":
                pattern = float_pattern
            new_entries.append((tag, pattern))
        replaced[first] = new_entries
    return replaced


class _Loader(yaml.SafeLoader):
    """SafeLoader whose int and float resolvers know nothing of base 60, and whose composer
    refuses documents nested deeper than MAX_DEPTH (it recurses once per level)."""

    def __init__(self, text: str, source: str, max_values: int) -> None:
        super().__init__(text)
        self.limit(text, source, max_values)

    def limit(self, text: str, source: str, max_values: int) -> None:
        self.text = text
        self.source = source
        self.depth = 0
        self.values = 0
        self.max_values = max_values

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self.depth += 1
        self.values += 1
        try:
            if self.values > self.max_values:
                where = _position(self.peek_event().start_mark)  # type: ignore[no-untyped-call]
                raise InputError(
                    SourceLocation(self.source, where.line, where.column),
                    too_many_values(self.max_values),
                    hint=VALUES_HINT,
                )
            if self.depth > MAX_DEPTH:
                where = _position(self.peek_event().start_mark)  # type: ignore[no-untyped-call]
                raise InputError(
                    SourceLocation(self.source, where.line, where.column),
                    f"nested more than {MAX_DEPTH} levels deep (the depth limit is {MAX_DEPTH})",
                    hint="a plan or inventory nests a few levels; see docs/input-contract.md",
                )
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self.depth -= 1


_Loader.yaml_implicit_resolvers = _without_sexagesimal(yaml.SafeLoader.yaml_implicit_resolvers)

try:  # libyaml, when PyYAML was built with it
    from yaml.cyaml import CParser as _CParser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the wheels ship it
    _CParser = None  # type: ignore[assignment,misc]


class _FastLoader(_Loader, _CParser):
    """_Loader reading its events from libyaml (several times faster): the same composer,
    resolvers, limits and constructor in Python, only the scanner and parser in C. Used for
    documents it reads without complaint; any refusal is read again by _Loader, so every
    error reads as it always has."""

    def __init__(self, text: str, source: str, max_values: int) -> None:
        _CParser.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self.limit(text, source, max_values)

    if _CParser is not None:
        check_event = _CParser.check_event
        peek_event = _CParser.peek_event
        get_event = _CParser.get_event
        dispose = _CParser.dispose


def _position(mark: yaml.Mark | None) -> Position:
    if mark is None:
        return Position(1, 1)
    return Position(mark.line + 1, mark.column + 1)


class NotYaml(InputError):
    """The text is empty or not YAML at all (a reader may then try another format)."""


@dataclass(frozen=True)
class SourceDocument:
    """A YAML document's plain data and where each of its values sits in the file."""

    path: str
    data: Any
    marks: Mapping[ValuePath, NodeMarks]

    @classmethod
    def from_text(cls, text: str, path: str, *, max_values: int = MAX_VALUES) -> SourceDocument:
        """Parse one YAML document; InputError for syntax errors, duplicate keys, emptiness,
        control characters and documents over the depth or expansion limits."""
        check_characters(text, path)
        if _CParser is not None:
            # the marks are read by _PlainReader when first asked for (_LazyMarks)
            data = _BLOCK_LINES.read(text, max_values)
            if data is not None:
                return cls(path=path, data=data, marks=_LazyMarks(text, path, max_values))
            plain = _PlainReader(_FastLoader(text, path, max_values)).read()
            if plain is not None:
                return plain
            try:
                return cls._compose(_FastLoader(text, path, max_values), path, max_values)
            except (InputError, InputErrors, RecursionError, yaml.YAMLError):
                pass  # read again by PyYAML's own parser, which words the refusal
        return cls._compose(_Loader(text, path, max_values), path, max_values)

    @classmethod
    def _compose(cls, loader: _Loader, path: str, max_values: int) -> SourceDocument:
        """Compose, check and build one document with `loader`."""
        try:
            node = loader.get_single_node()
            if node is None:
                raise NotYaml(SourceLocation(path, 1, 1), "the file is empty")
            measure_expansion(node, path, max_values)
            builder = _Builder(loader, path)
            data = builder.build(node, ())
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = _position(mark)
            context = exc.context
            if context and exc.context_mark is not None and exc.context_mark is not mark:
                # the context starts elsewhere (an unclosed bracket, a first anchor): say where
                context += f" (line {_position(exc.context_mark).line})"
            problem = "; ".join(p for p in (context, exc.problem) if p)
            raise NotYaml(
                SourceLocation(path, where.line, where.column),
                f"not valid YAML: {problem or exc}",
            ) from exc
        except yaml.YAMLError as exc:
            raise NotYaml(SourceLocation(path), f"not valid YAML: {exc}") from exc
        except RecursionError as exc:  # a last guard: MAX_DEPTH should stop it first
            raise InputError(
                SourceLocation(path), f"nested too deeply (the depth limit is {MAX_DEPTH})"
            ) from exc
        finally:
            loader.dispose()
        if builder.errors:
            raise InputErrors(builder.errors)
        return cls(path=path, data=data, marks=types.MappingProxyType(builder.marks))

    @classmethod
    def from_path(
        cls, path: Path, *, max_bytes: int = MAX_INPUT_BYTES, max_values: int = MAX_VALUES
    ) -> SourceDocument:
        """Read and parse a YAML file; InputError when it is missing, unreadable, not a
        regular file, larger than max_bytes or over max_values once aliases are expanded."""
        text = read_text(path, max_bytes=max_bytes)
        return cls.from_text(text, input_name(path), max_values=max_values)

    def location_of(self, path: Sequence[PathPart], *, at_key: bool = False) -> SourceLocation:
        """Where the value at `path` starts (its key with at_key); the nearest parent if absent."""
        probe = tuple(path)
        while probe and probe not in self.marks:
            probe = probe[:-1]
            at_key = True  # a missing value is reported at the key that should hold it
        marks = self.marks.get(probe)
        if marks is None:
            return SourceLocation(self.path, 1, 1)
        where = marks.key if (at_key and marks.key is not None) else marks.value
        return SourceLocation(self.path, where.line, where.column)

    def value_at(self, path: Sequence[PathPart]) -> Any:
        """The data at `path`; KeyError/IndexError/TypeError when it is not there."""
        value = self.data
        for part in path:
            value = value[part]
        return value

    def validate(self, model: type[ModelT]) -> ModelT:
        """Validate the data against `model`; InputErrors with every problem, located."""
        try:
            return model.model_validate(self.data)
        except pydantic.ValidationError as exc:
            raise InputErrors(self.errors_from(exc, model)) from exc

    def errors_from(
        self, exc: pydantic.ValidationError, model: type[pydantic.BaseModel]
    ) -> list[InputError]:
        """Translate pydantic's errors into located InputErrors, in file order."""
        found = [self._input_error(err, model) for err in exc.errors() if not self._is_echo(err)]
        return sort_errors(found)

    def _is_echo(self, err: Mapping[str, Any]) -> bool:
        """A length error pydantic adds because some items failed, not because too few exist."""
        if err["type"] not in {"too_short", "too_long"}:
            return False
        value = self._value_or_none(self._data_path(err["loc"]))
        ctx: Mapping[str, Any] = err.get("ctx") or {}
        if not isinstance(value, list):
            return False
        low = int(ctx.get("min_length", 0))
        high = int(ctx.get("max_length", len(value)))
        return low <= len(value) <= high

    def _input_error(self, err: Mapping[str, Any], model: type[pydantic.BaseModel]) -> InputError:
        kind = str(err["type"])
        path = self._data_path(err["loc"])
        loc_parts = [p for p in err["loc"] if isinstance(p, str | int)]
        if kind == "missing":
            name = str(loc_parts[-1]) if loc_parts else "?"
            return InputError(
                self.location_of(path, at_key=True),
                f"required key '{name}' is missing",
                field=format_path((*path, name)),
            )
        if kind == "extra_forbidden":
            name = str(loc_parts[-1]) if loc_parts else "?"
            parent = path[:-1] if path and path[-1] == loc_parts[-1] else path
            allowed = allowed_keys(model, parent)
            hint = did_you_mean(name, allowed)
            if hint is None and allowed:
                hint = "known keys: " + ", ".join(sorted(allowed))
            return InputError(
                self.location_of((*parent, loc_parts[-1]), at_key=True),
                f"unknown key {_shown(name)}",
                field=format_path(parent),
                hint=hint,
            )
        message, hint = describe_problem(err)
        problem = (err.get("ctx") or {}).get("error")
        if isinstance(problem, FieldProblem) and problem.at:
            path = self._data_path((*path, *problem.at))
        # a rule about a whole model or list is shown at the key that names it
        value = self._value_or_none(path)
        at_key = isinstance(value, list) or (
            isinstance(value, dict) and bool(allowed_keys(model, path))
        )
        return InputError(
            self.location_of(path, at_key=at_key), message, field=format_path(path), hint=hint
        )

    def _value_or_none(self, path: Sequence[PathPart]) -> Any:
        try:
            return self.value_at(path)
        except (KeyError, IndexError, TypeError):
            return None

    def _data_path(self, loc: Sequence[Any]) -> ValuePath:
        """The part of pydantic's `loc` that names real data, without union-member tags."""
        value = self.data
        path: list[PathPart] = []
        for part in loc:
            in_dict = isinstance(value, dict) and part in value
            in_list = isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)
            if in_dict or in_list:
                value = value[part]
                path.append(part)
        return tuple(path)


class _Builder:
    """Builds plain data from a composed node tree, recording marks and duplicate keys."""

    def __init__(self, loader: _Loader, path: str) -> None:
        self.loader = loader
        self.path = path
        self.marks: dict[ValuePath, NodeMarks] = {}
        self.errors: list[InputError] = []
        self._active: list[int] = []

    def build(self, node: Node, path: ValuePath, key: Position | None = None) -> Any:
        self.marks.setdefault(path, NodeMarks(_position(node.start_mark), key))
        if id(node) in self._active or len(self._active) > MAX_DEPTH:
            raise yaml.constructor.ConstructorError(
                None, None, "recursive or too deeply nested aliases", node.start_mark
            )
        self._active.append(id(node))
        try:
            if isinstance(node, MappingNode | SequenceNode) and node.tag not in _PLAIN_TAGS:
                # a tag on a mapping or list would otherwise be dropped without a word
                where = _position(node.start_mark)
                raise InputError(
                    SourceLocation(self.path, where.line, where.column),
                    f"found the tag {node.tag!r}; allowed are plain mappings, lists and scalars",
                    hint="remove the tag (the word after '!')",
                )
            if isinstance(node, MappingNode):
                return self._build_mapping(node, path)
            if isinstance(node, SequenceNode):
                return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            return self._construct(node)
        finally:
            self._active.pop()

    def _construct(self, node: Node) -> Any:
        """A scalar's value; InputError where PyYAML's constructors raise plain errors
        (an integer of more digits than Python converts, a bad base64 `!!binary`)."""
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, OverflowError, TypeError) as exc:
            where = _position(node.start_mark)
            raise InputError(
                SourceLocation(self.path, where.line, where.column),
                f"cannot read the value {describe_value(str(node.value))}: {exc}",
            ) from exc

    def _build_mapping(self, node: MappingNode, path: ValuePath) -> dict[Any, Any]:
        seen: dict[Any, Position] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.value == "<<":
                continue
            key = self._construct(key_node)
            here = _position(key_node.start_mark)
            if _hashable(key) and key in seen:
                first = seen[key]
                self.errors.append(
                    InputError(
                        SourceLocation(self.path, here.line, here.column),
                        f"duplicate key {_shown(key)} (first at line {first.line})",
                        field=format_path(path) or None,
                        hint="YAML keeps only the last one; remove one of them",
                    )
                )
            elif _hashable(key):
                seen[key] = here
        # flatten_mapping resolves `<<` merge keys in place, as SafeLoader does.
        self.loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self._construct(key_node)
            if not _hashable(key):
                raise yaml.constructor.ConstructorError(
                    "while building a mapping",
                    node.start_mark,
                    "found an unhashable key",
                    key_node.start_mark,
                )
            if not isinstance(key, str):
                where = _position(key_node.start_mark)
                self.errors.append(
                    InputError(
                        SourceLocation(self.path, where.line, where.column),
                        f"expected a string key, found {describe_value(key)}",
                        field=format_path(path) or None,
                        hint=f'quote it: "{key_node.value}":',
                    )
                )
                continue
            child = (*path, key)
            # a later key overrides a merged one; keep the later key's marks
            self.marks.pop(child, None)
            result[key] = self.build(value_node, child, _position(key_node.start_mark))
        return result


class _NotPlain(Exception):
    """The document uses what only the composing path reads (or refuses) as it should."""


_STR_TAG = "tag:yaml.org,2002:str"


class _PlainReader:
    """A plain document built straight from libyaml's events, without composing a node graph.

    Most input (every recorded node.yaml of a fleet) is plain YAML: no anchors, aliases or
    tags on mappings and lists, no merge keys, string keys each once, well within the limits.
    For such a document the composed graph is a tree and its expansion is itself, so building
    from the events gives _Builder's data and marks at a fraction of the cost. Anything else
    (or any error) reads as None, and SourceDocument composes the document as it always has.

    The data is read first without marks (_LazyMarks reads the text again for them, on the
    first location asked for): a valid file is never asked where its values are.
    """

    def __init__(self, loader: _Loader, *, with_marks: bool = False) -> None:
        self.loader = loader
        # PyYAML's parser and resolver methods are untyped; events are read as Any
        self.events: Any = loader
        self.marks: dict[ValuePath, NodeMarks] | None = {} if with_marks else None
        self.values = 0

    def read(self) -> SourceDocument | None:
        loader = self.events
        try:
            loader.get_event()  # StreamStartEvent
            if not loader.check_event(yaml.DocumentStartEvent):
                return None
            loader.get_event()
            data = self._value((), None, 1)
            if not loader.check_event(yaml.DocumentEndEvent):
                return None
            loader.get_event()
            if not loader.check_event(yaml.StreamEndEvent):
                return None
        except (_NotPlain, yaml.YAMLError, ValueError, OverflowError, TypeError):
            return None
        finally:
            loader.dispose()
        source = self.loader.source
        marks: Mapping[ValuePath, NodeMarks]
        if self.marks is None:
            marks = _LazyMarks(self.loader.text, source, self.loader.max_values)
        else:
            marks = types.MappingProxyType(self.marks)
        return SourceDocument(path=source, data=data, marks=marks)

    def _value(self, path: ValuePath, key: Position | None, depth: int) -> Any:
        event = self._next(depth)
        if self.marks is not None:
            self.marks[path] = NodeMarks(_position(event.start_mark), key)
        if event.__class__ is yaml.ScalarEvent:
            return self._scalar(event)
        if getattr(event, "tag", None) not in (None, "!"):
            raise _NotPlain  # a tag on a mapping or list: refused, worded by _Builder
        loader = self.events
        marked = self.marks is not None
        if isinstance(event, yaml.SequenceStartEvent):
            items: list[Any] = []
            while not loader.check_event(yaml.SequenceEndEvent):
                items.append(self._value((*path, len(items)) if marked else (), None, depth + 1))
            loader.get_event()
            return items
        if not isinstance(event, yaml.MappingStartEvent):
            raise _NotPlain  # an alias
        result: dict[str, Any] = {}
        while not loader.check_event(yaml.MappingEndEvent):
            key_event = self._next(depth + 1)
            key_mark = key_event.start_mark
            if key_event.__class__ is not yaml.ScalarEvent:
                raise _NotPlain
            name = self._scalar(key_event, _STR_TAG)
            if not isinstance(name, str) or name in result:
                raise _NotPlain  # merge keys, other keys than strings, a repeated key
            if marked:
                result[name] = self._value((*path, name), _position(key_mark), depth + 1)
            else:
                result[name] = self._value((), None, depth + 1)
        loader.get_event()
        return result

    def _next(self, depth: int) -> Any:
        """The next event, counted as _Loader.compose_node counts values and depth."""
        self.values += 1
        if self.values >= self.loader.max_values or depth >= MAX_DEPTH:
            raise _NotPlain
        event = self.events.get_event()
        if getattr(event, "anchor", None) is not None:
            raise _NotPlain
        return event

    def _scalar(self, event: Any, only_tag: str | None = None) -> Any:
        """The value composing and constructing the event's node gives (Composer, _Builder)."""
        tag = event.tag
        if tag is None or tag == "!":
            value = event.value
            if not event.implicit[0] or (value and value[0] not in _RESOLVED_FIRST):
                # what Resolver.resolve gives a quoted scalar, or a plain one no implicit
                # resolver looks at (none is keyed on its first character)
                tag = _STR_TAG
            else:
                tag = self.events.resolve(ScalarNode, value, event.implicit)
        if only_tag is not None and tag != only_tag:
            raise _NotPlain
        if tag == _STR_TAG:  # SafeConstructor's str is the scalar's text (construct_yaml_str)
            return event.value
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
        return self.loader.construct_object(node, deep=True)


# The first characters _Loader's implicit resolvers are keyed on; a plain scalar starting
# with any other character is a string (there are no wildcard or path resolvers).
# (tests/unit/test_yaml_fast_path.py checks there are none)
_RESOLVED_FIRST = frozenset(k for k in _Loader.yaml_implicit_resolvers if k)


# Resolves and constructs one-line plain scalars for the line reader: resolving reads only the
# class's resolvers, and a scalar's constructor keeps no state, so one loader serves all.
_SCALARS: Any = _Loader("", "<scalar>", 1)


@functools.lru_cache(maxsize=4096)
def _plain_scalar(text: str) -> Any:
    """A one-line plain scalar's value, as _PlainReader reads it; NotPlain where PyYAML's
    constructor raises (the document is then read by the composer, which words it)."""
    if text[0] not in _RESOLVED_FIRST:
        return text
    tag = _SCALARS.resolve(ScalarNode, text, (True, False))
    if tag == _STR_TAG:
        return text
    construct = _SCALARS.yaml_constructors.get(tag)
    if construct is None:
        raise NotPlain
    try:
        return construct(_SCALARS, ScalarNode(tag, text, None, None))
    except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
        raise NotPlain from exc


_BLOCK_LINES = BlockReader(_plain_scalar)


class _LazyMarks(Mapping[ValuePath, NodeMarks]):
    """A plain document's marks, read from its text when first asked for."""

    def __init__(self, text: str, source: str, max_values: int) -> None:
        self._text = text
        self._source = source
        self._max_values = max_values
        self._marks: Mapping[ValuePath, NodeMarks] | None = None

    def _read(self) -> Mapping[ValuePath, NodeMarks]:
        if self._marks is None:
            loader = _FastLoader(self._text, self._source, self._max_values)
            document = _PlainReader(loader, with_marks=True).read()
            if document is None:  # the text read as plain once; it cannot change its mind
                raise AssertionError(f"{self._source}: marks of a plain document not read")
            self._marks = document.marks
        return self._marks

    def __getitem__(self, path: ValuePath) -> NodeMarks:
        return self._read()[path]

    def __iter__(self) -> Iterator[ValuePath]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __contains__(self, path: object) -> bool:
        return path in self._read()


def _shown(key: object) -> str:
    """A key as quoted in a message: shortened, control characters escaped."""
    text = shorten(str(key))
    return "'" + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text) + "'"


_PLAIN_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
