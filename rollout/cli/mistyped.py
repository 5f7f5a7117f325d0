"""Command lines that are almost right: a mistyped (sub)command, an option of another command.

Each gets one line naming what was meant, where argparse would list every choice or say
"unrecognized arguments".
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

# options a user reaches for on a command that has none such (kubectl's --dry-run, plan's
# --facts), and the command that does it; none of them is an option of that command
ELSEWHERE: dict[tuple[str, str], str] = {
    ("apply", "--dry-run"): "apply has no --dry-run: `rollout plan PLAN -i INV` shows what "
    "apply would do",
    ("apply", "--facts"): "apply has no --facts: it reads the nodes themselves; "
    "`rollout plan PLAN --facts DIR` plans from recorded facts",
}


def subcommands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name; empty where it has none (or they are not built)."""
    # argparse has no public way to list a parser's subcommands
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def mistyped_command(parser: argparse.ArgumentParser, words: Sequence[str]) -> str | None:
    """The message for a command line whose command (`rollout plna`) or subcommand
    (`rollout lab upp`) does not exist, with the nearest one; None when each word exists."""
    level, rest = parser, list(words)
    said: list[str] = []
    while choices := subcommands_of(level):
        # no option of a level with subcommands takes a value: the first word is the command
        word = next((w for w in rest if not w.startswith("-")), None)
        if word is None:
            return None
        if word not in choices:
            return _unknown(said, word, sorted(choices))
        level, said, rest = choices[word], [*said, word], rest[rest.index(word) + 1 :]
    return None


def option_elsewhere(command: str | None, words: Sequence[str]) -> str | None:
    """Where an option of the line belongs on another command, why; else None."""
    if command is None:
        return None
    for word in words:
        if word == "--":
            break
        option = word.split("=", 1)[0]
        if (command, option) in ELSEWHERE:
            return ELSEWHERE[command, option]
    return None


def _unknown(said: list[str], word: str, choices: list[str]) -> str:
    from rollout.cli.render import show_controls

    # the word is input: its controls print, they do not act
    typed = " ".join([*said, show_controls(word)])
    nearest = difflib.get_close_matches(word, choices, n=1)
    if nearest:
        meant = " ".join([*said, nearest[0]])
        return f"unknown command '{typed}'; did you mean '{meant}'?"
    where = f"rollout {' '.join(said)}".strip()
    return f"unknown command '{typed}'; the commands of {where} are: {', '.join(choices)}"
