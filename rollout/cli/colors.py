"""Whether text output is coloured: `--color auto|always|never`, `--no-color` and NO_COLOR.

NO_COLOR (any non-empty value, https://no-color.org) turns colour off where the choice is
`auto`; an option given on the command line wins over it, as no-color.org asks.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

NO_COLOR_ENV = "NO_COLOR"
# --color's choices, and what each asks of the console: None lets it look at the stream
COLOR_CHOICES: dict[str, bool | None] = {"auto": None, "always": True, "never": False}


def add_color_options(parser: argparse.ArgumentParser) -> None:
    """`--color WHEN` and its short form `--no-color`, into `args.color`."""
    parser.add_argument(
        "--color",
        choices=tuple(COLOR_CHOICES),
        default="auto",
        help="colour text output (auto: on a terminal, unless NO_COLOR is set)",
    )
    parser.add_argument(
        "--no-color",
        dest="color",
        action="store_const",
        const="never",
        help="the same as --color never",
    )


def chosen_color(args: argparse.Namespace) -> bool | None:
    """True or False where the command line chose, None to decide by the stream."""
    return COLOR_CHOICES[args.color]


def color_wanted(color: bool | None, environ: Mapping[str, str] | None = None) -> bool | None:
    """The choice, with NO_COLOR turning an undecided one off."""
    env = os.environ if environ is None else environ
    if color is None and env.get(NO_COLOR_ENV, ""):
        return False
    return color
