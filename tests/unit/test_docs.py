"""The documentation against the code: the plan model's fields in docs/plan-reference.md, the
commands and options the README and docs/*.md show against the CLI's parser, and the README's
first lines.

The parser is read from rollout.cli.build_parser (argparse's own tables), never from help text.
"""

from __future__ import annotations

import argparse
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

from rollout.cli import build_parser
from rollout.spec import Spec

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PLAN_REFERENCE = ROOT / "docs" / "plan-reference.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


# ---------------------------------------------------------------- (a) the plan model's fields


def nested_models(annotation: object) -> Iterator[type[BaseModel]]:
    """The pydantic models a field's annotation holds (through Annotated, unions, tuples)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for argument in typing.get_args(annotation):
        yield from nested_models(argument)


def field_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field of `model` and of the models under it, as the keys a plan.yaml writes."""
    for name, info in model.model_fields.items():
        path = (*prefix, info.alias or name)
        yield path
        for inner in nested_models(info.annotation):
            yield from field_paths(inner, path)


def test_field_walk_sees_nested_models_and_aliases() -> None:
    paths = set(field_paths(Spec))
    assert ("apiVersion",) in paths
    assert (
        "changes",
        "time-slicing",
        "config",
        "sharing",
        "timeSlicing",
        "renameByDefault",
    ) in paths
    assert ("policy", "driver", "reboot_if_busy") in paths
    assert ("changes", "registry", "endpoints", "ca_file") in paths


_HEADING = re.compile(r"^(#{2,3}) +(.*)$")
_ROW_KEY = re.compile(r"^\| *`([^`]+)` *\|")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def keys_of(text: str) -> tuple[str, ...]:
    """`config.sharing.timeSlicing.resources[].name` -> its keys, `[]` dropped."""
    return tuple(part.replace("[]", "") for part in text.split("."))


def documented_claims(markdown: str) -> list[tuple[str, ...]]:
    """Each key path the reference names: a section heading's (`## policy`, `### policy.drain`,
    `### registry` under `## changes`) and each table row's first cell within its section."""
    claims: list[tuple[str, ...]] = []
    section: tuple[str, ...] = ()
    subsection: tuple[str, ...] = ()
    for line in markdown.splitlines():
        heading = _HEADING.match(line)
        if heading:
            first = heading.group(2).replace("`", "").split(" ")[0]
            words = keys_of(first) if all(_KEY.fullmatch(k) for k in keys_of(first)) else ()
            if heading.group(2).startswith("Top level"):
                words = ()
            if len(heading.group(1)) == 2:
                section, subsection = words, ()
                claims.append(section)
            else:
                subsection = words if words[: len(section)] == section else (*section, *words)
                claims.append(subsection)
            continue
        row = _ROW_KEY.match(line)
        if row:
            claims.append((*(subsection or section), *keys_of(row.group(1))))
    return claims


def is_subsequence(short: tuple[str, ...], long: tuple[str, ...]) -> bool:
    rest = iter(long)
    return all(key in rest for key in short)


def documents(claim: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """A claim names a field when, up to the field's own key, it follows the field's path."""
    last = path[-1]
    if last not in claim:
        return False
    upto = claim[: claim.index(last) + 1]
    return is_subsequence(upto, path)


def test_every_plan_field_is_in_the_reference() -> None:
    claims = documented_claims(PLAN_REFERENCE.read_text())
    missing = [
        ".".join(path)
        for path in field_paths(Spec)
        if not any(documents(claim, path) for claim in claims)
    ]
    assert missing == [], f"docs/plan-reference.md lacks {missing}"


def test_the_reference_check_finds_a_missing_field() -> None:
    claims = documented_claims("## policy\n\n| key | default |\n|---|---|\n| `waves` | `[1]` |\n")
    assert any(documents(claim, ("policy", "waves")) for claim in claims)
    assert not any(documents(claim, ("policy", "driver", "reload")) for claim in claims)
    assert not any(documents(claim, ("policy", "driver")) for claim in claims)


# ---------------------------------------------------------------- (b) commands and options


@dataclass(frozen=True)
class Shown:
    """A `rollout ...` command line a document shows."""

    where: str
    words: tuple[str, ...]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (argparse's table), {} when it has none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")
# a shell line's commands: split at pipes, `&&`, `||`, `;` and `$(`; a comment ends the line
_SEPARATOR = re.compile(r"\s(?:\||&&|\|\||;)\s|;\s|\$\(")
_COMMENT = re.compile(r"(?:^|\s)#.*$")
# `rollout` run by a shell: after a prompt, sudo, an environment assignment or a path
_RUN = re.compile(r"^(?:\$\s+)?(?:sudo\s+)?(?:\w+=\S*\s+)*(?:[\w./-]*/)?rollout (.*)$")
_END_OF_COMMAND = re.compile(r"\s[#><]|\)")


def command_words(rest: str) -> tuple[str, ...]:
    """The words of one command after `rollout `, up to a redirection, a comment or `)`."""
    end = _END_OF_COMMAND.search(rest)
    return tuple((rest[: end.start()] if end else rest).split())


def shown_commands(path: Path) -> Iterator[Shown]:
    """Each `rollout ...` a document shows: in code blocks (continued lines joined) and in
    code spans that start with it."""
    text = path.read_text()
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    for block in _FENCE.finditer(text):
        joined = re.sub(r"\\\n\s*", " ", block.group(1))
        for line in joined.splitlines():
            for piece in _SEPARATOR.split(_COMMENT.sub("", line)):
                match = _RUN.match(piece.strip())
                if match:
                    shown = f"{name} (code block): {line.strip()}"
                    yield Shown(shown, command_words(match.group(1)))
    outside = _FENCE.sub("", text)
    for span in _SPAN.finditer(outside):
        code = " ".join(span.group(1).split())
        found = _RUN.match(code)
        if found:
            yield Shown(f"{name}: `{code}`", command_words(found.group(1)))


def problems_of(shown: Shown, parser: argparse.ArgumentParser) -> list[str]:
    """What in one shown command the parser lacks: a subcommand, or an option of it."""
    words = list(shown.words)
    allowed = options(parser)
    current = parser
    problems: list[str] = []
    # the command words: rollout lab up, rollout apply; `lab up|down` names each
    while words and subcommands(current):
        word = words[0]
        if not re.fullmatch(r"[a-z][a-z|-]*", word):
            break
        choices = subcommands(current)
        names = [n for n in word.split("|") if n]
        unknown = [n for n in names if n not in choices]
        if unknown:
            problems.append(f"{shown.where}: no command {' '.join(unknown)!r}")
            return problems
        words.pop(0)
        if len(names) > 1:
            return problems  # alternatives: each exists; their options differ
        current = choices[names[0]]
        allowed |= options(current)
    for word in words:
        for flag in re.findall(r"(?:^|[\[|])(--[a-z][a-z0-9-]*)", word):
            if flag not in allowed:
                problems.append(f"{shown.where}: no option {flag}")
    return problems


def documents_read() -> list[Path]:
    return [README, *DOCS]


def test_documents_show_rollout_commands() -> None:
    shown = [s for path in documents_read() for s in shown_commands(path)]
    firsts = {s.words[0] for s in shown if s.words}
    assert {"plan", "apply", "lab", "schedule"} <= firsts


@pytest.mark.parametrize("path", documents_read(), ids=lambda p: p.name)
def test_every_command_and_option_shown_exists(path: Path) -> None:
    parser = build_parser()
    problems = [p for shown in shown_commands(path) for p in problems_of(shown, parser)]
    assert problems == []


def test_the_command_check_finds_what_the_parser_lacks(tmp_path: Path) -> None:
    parser = build_parser()
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `rollout rewind RUN`, or:\n\n```sh\nrollout plan p.yaml --facts f --no-such-flag\n"
        "sudo .venv/bin/rollout lab up --nodes 2 && rollout lab explode\n"
        "rollout lab up|down|status\n```\n"
    )
    found = [p for shown in shown_commands(doc) for p in problems_of(shown, parser)]
    assert [p.split(": ")[-1] for p in found] == [
        "no option --no-such-flag",
        "no command 'explode'",
        "no command 'rewind'",
    ]


# ---------------------------------------------------------------- (c) the README


def test_readme_starts_with_the_two_set_up_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# ")
    fence = 1 + next(i for i, line in enumerate(lines[1:]) if line.startswith("```"))
    assert fence <= 3, "at most a one-line description between the title and the commands"
    start = fence + 1
    end = start + lines[start:].index("```")
    commands = [line.split("#")[0].strip() for line in lines[start:end]]
    assert commands == ["bash scripts/demo", "bash scripts/test"]
    after = " ".join(lines[end + 1 : end + 6])
    for needed in ("root", "Debian", "systemd-nspawn"):
        assert needed in after


def test_readme_claims_nothing_is_missing() -> None:
    text = README.read_text()
    assert re.findall(r"(?i)not (?:built )?yet|not built|to be built", text) == []


def test_readme_links_every_doc() -> None:
    text = README.read_text()
    missing = [p.name for p in DOCS if f"docs/{p.name}" not in text]
    assert missing == []
