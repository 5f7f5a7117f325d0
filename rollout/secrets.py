"""Which settings are secrets, and how output shows them: that they changed, never their value.

Registry credentials live in two places rollout reads and rewrites: the CRI plugin's
`registry.auths` / `registry.configs."<host>".auth` tables (username, password, auth,
identitytoken) and hosts.toml `header` tables (an `Authorization` header for a mirror). The
plan carries the real text (apply writes it); everything a person or a log sees goes through
the functions here first (invariant 9).
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REDACTED = "<redacted>"
REDACTED_CHANGED = "<redacted: changed>"

# a table of this name holds only secrets (registry credentials, HTTP headers)
SECRET_TABLES = frozenset({"auths", "auth", "header", "headers"})
# a key of this name is a secret wherever it appears (an unknown table in a diff hunk)
SECRET_KEYS = frozenset({"auth", "password", "identitytoken", "username", "authorization"})

_UNKNOWN_TABLE: tuple[str, ...] | None = None
_HEADER = re.compile(r"^\s*\[\[?(?P<name>[^\[\]]+)\]\]?\s*(#.*)?$")
_BARE_OR_QUOTED = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY_VALUE = re.compile(
    rf"^(?P<lead>\s*)(?P<key>{_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)"
    r"(?P<eq>\s*=\s*)(?P<value>.*)$"
)
_KEY_PART = re.compile(_BARE_OR_QUOTED)


def is_secret_path(path: Sequence[str]) -> bool:
    """Whether the setting at this key path is (or holds) a registry credential or header."""
    if any(part.lower() in SECRET_TABLES for part in path[:-1]):
        return True
    return bool(path) and path[-1].lower() in SECRET_KEYS | SECRET_TABLES


def redact_value(path: Sequence[str], value: Any, marker: str = REDACTED) -> Any:
    """`value` (a leaf or a table) with every secret inside it replaced by `marker`."""
    if value is None:
        return None
    if is_secret_path(path):
        return marker
    if isinstance(value, Mapping):
        return {k: redact_value([*path, str(k)], v, marker) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(path, v, marker) for v in value]
    return value


def redact_change(path: Sequence[str], before: Any, after: Any) -> tuple[Any, Any]:
    """Both sides of a changed setting, secrets replaced: `after` says whether one changed."""
    if isinstance(before, Mapping) and isinstance(after, Mapping) and not is_secret_path(path):
        old: dict[str, Any] = {}
        new: dict[str, Any] = {}
        for key in [*before, *(k for k in after if k not in before)]:
            sub_old, sub_new = redact_change([*path, str(key)], before.get(key), after.get(key))
            if key in before:
                old[key] = sub_old
            if key in after:
                new[key] = sub_new
        return old, new
    marker = REDACTED if before == after else REDACTED_CHANGED
    return redact_value(path, before), redact_value(path, after, marker)


def parse_path(dotted: str) -> tuple[str, ...]:
    """`plugins."io.containerd.grpc.v1.cri".registry` -> its parts (format_path's inverse)."""
    return _split_key(dotted)


def redact_toml(text: str) -> str:
    """A TOML file's text with every secret value replaced by `<redacted>`."""
    return _redact_lines(text, {})[0]


def secret_values(text: str) -> dict[tuple[str, ...], str]:
    """Each secret of a TOML text by its key path, as written (what redact_toml hides)."""
    return _redact_lines(text, {})[1]


def fill_secrets(redacted: str, values: Mapping[tuple[str, ...], str]) -> str:
    """redact_toml's output with each `<redacted>` value put back from `values`, by key path
    (a saved plan's file, its credentials carried over from the node); KeyError: a path
    `values` lacks."""
    out: list[str] = []
    table: tuple[str, ...] | None = ()
    for line in redacted.splitlines(keepends=True):
        table, setting = _read_line(line, table)
        if setting is None or setting.match.group("value").strip() != REDACTED:
            out.append(line)
            continue
        match, end = setting.match, "\n" if line.endswith("\n") else ""
        out.append(
            f"{match.group('lead')}{match.group('key')}{match.group('eq')}"
            f"{values[setting.path]}{end}"
        )
    return "".join(out)


# Fleets repeat a few file texts over thousands of nodes: redact each distinct text once.
# Texts are keys (their hashes are cached by str); results are immutable.
@functools.lru_cache(maxsize=4096)
def redact_toml_pair(before: str | None, after: str | None) -> tuple[str | None, str | None]:
    """Both versions of a TOML file, secrets replaced; a secret that differs between them
    shows as `<redacted: changed>` in `after`, so a diff says it changed and nothing more."""
    if before is None:
        return None, None if after is None else _redact_lines(after, {}, REDACTED_CHANGED)[0]
    redacted_before, seen = _redact_lines(before, {})
    if after is None:
        return redacted_before, None
    return redacted_before, _redact_lines(after, seen, compare=True)[0]


@functools.lru_cache(maxsize=4096)
def redact_diff(diff: str) -> str:
    """A unified diff of TOML texts, secrets replaced (`-` lines `<redacted>`, `+` lines
    `<redacted: changed>`). Where a hunk starts below its table header, keys named like
    credentials are redacted wherever they are."""
    out: list[str] = []
    table: tuple[str, ...] | None = _UNKNOWN_TABLE
    for line in diff.splitlines(keepends=True):
        if line.startswith(("---", "+++")) or line[:1] not in ("+", "-", " "):
            if line.startswith("@@"):
                table = _UNKNOWN_TABLE
            out.append(line)
            continue
        sign, body = line[0], line[1:]
        table, setting = _read_line(body, table)
        if setting is None:
            out.append(line)
            continue
        match, path = setting.match, setting.path
        secret = is_secret_path(path) or _holds_secret(path, match.group("value"))
        if table is None and setting.key and setting.key[-1].lower() in SECRET_KEYS:
            secret = True
        if secret:
            marker = REDACTED_CHANGED if sign == "+" else REDACTED
            end = "\n" if line.endswith("\n") else ""
            out.append(
                f"{sign}{match.group('lead')}{match.group('key')}{match.group('eq')}{marker}{end}"
            )
        else:
            out.append(line)
    return "".join(out)


def _redact_lines(
    text: str,
    seen: dict[tuple[str, ...], str],
    marker: str = REDACTED,
    compare: bool = False,
) -> tuple[str, dict[tuple[str, ...], str]]:
    """Redact `text`; `seen` maps each secret's path to its raw value (filled when not
    comparing; when comparing, a value that differs from `seen` is marked changed)."""
    out: list[str] = []
    values: dict[tuple[str, ...], str] = {}
    table: tuple[str, ...] | None = ()
    lines = text.splitlines(keepends=True)
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        table, setting = _read_line(line, table)
        if setting is None:
            out.append(line)
            continue
        match, path = setting.match, setting.path
        value = match.group("value")
        if not (is_secret_path(path) or _holds_secret(path, value)):
            out.append(line)
            continue
        # a multi-line string or array goes whole
        raw = [value]
        while _is_open(" ".join(raw)) and index < len(lines):
            raw.append(lines[index])
            index += 1
        raw_value = "".join(raw).strip()
        values[path] = raw_value
        shown = marker
        if compare:
            shown = REDACTED if seen.get(path) == raw_value else REDACTED_CHANGED
        end = "\n" if "".join(raw).endswith("\n") or line.endswith("\n") else ""
        out.append(f"{match.group('lead')}{match.group('key')}{match.group('eq')}{shown}{end}")
    return "".join(out), values


@dataclass(frozen=True)
class _Setting:
    """A `key = value` line: its match, the key's parts and the full path (table and key)."""

    match: re.Match[str]
    key: tuple[str, ...]
    path: tuple[str, ...]


def _read_line(
    line: str, table: tuple[str, ...] | None
) -> tuple[tuple[str, ...] | None, _Setting | None]:
    """One TOML line read in `table` (None: not known): the table in effect after it, and
    the setting it makes, if it makes one."""
    header = _HEADER.match(line)
    if header and not _KEY_VALUE.match(line):
        return _split_key(header.group("name")), None
    match = _KEY_VALUE.match(line)
    if match is None:
        return table, None
    key = _split_key(match.group("key"))
    return table, _Setting(match, key, (*(table or ()), *key))


def _holds_secret(path: tuple[str, ...], value: str) -> bool:
    """An inline table or array value with a secret somewhere inside."""
    if not value.lstrip().startswith(("{", "[")):
        return False
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        # cannot tell what is inside: a credential-looking word is enough to hide it
        return any(word in value.lower() for word in SECRET_KEYS | SECRET_TABLES)
    return bool(redact_value(path, parsed) != parsed)


def _is_open(value: str) -> bool:
    """Whether a TOML value continues on the next line (multi-line string or array)."""
    stripped = value.strip()
    for quote in ('"""', "'''"):
        if stripped.startswith(quote):
            return stripped.count(quote) < 2
    if stripped.startswith("["):
        try:
            tomllib.loads(f"v = {stripped}")
        except tomllib.TOMLDecodeError:
            return stripped.count("[") > stripped.count("]")
    return False


def _split_key(text: str) -> tuple[str, ...]:
    parts: list[str] = []
    for token in _KEY_PART.findall(text):
        if token.startswith('"'):
            try:
                parts.append(str(tomllib.loads(f"k = {token}")["k"]))
            except tomllib.TOMLDecodeError:
                parts.append(token[1:-1])
        elif token.startswith("'"):
            parts.append(token[1:-1])
        else:
            parts.append(token)
    return tuple(parts)
