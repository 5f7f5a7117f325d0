"""`rollout completion bash|zsh`: a shell completion script generated from the parser itself,
so that every command, `lab` subcommand, option and choice rollout has is completed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollout.cli import add_listed_command, build_parser
from rollout.cli.mistyped import subcommands_of
from rollout.errors import ExitCode

SHELLS = ("bash", "zsh")
# arguments completed as paths besides those of type Path (--kubeconfig FILE, --schedule PLAN)
PATH_METAVARS = ("FILE", "PLAN", "PATH")

EPILOG = """\
to load it in every new shell:
  bash: rollout completion bash > ~/.local/share/bash-completion/completions/rollout
  zsh:  rollout completion zsh > "${fpath[1]}/_rollout"   (then start a new shell)
or for this shell only:
  source <(rollout completion bash)
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `completion SHELL`."""
    parser = add_listed_command(
        subparsers,
        "completion",
        "Print a completion script for SHELL, generated from rollout's own parser.",
        EPILOG,
        as_written=True,
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    parser.set_defaults(func=run_completion)


def run_completion(args: argparse.Namespace) -> int:
    import shtab

    parser = build_parser()
    complete_paths(parser)
    sys.stdout.write(shtab.complete(parser, args.shell))
    sys.stdout.write("\n")
    return ExitCode.OK


def complete_paths(parser: argparse.ArgumentParser) -> None:
    """Mark each argument that names a file (a directory for DIR) to complete as one, in
    `parser` and its subcommands; shtab reads the mark from the argument's `complete`."""
    import shtab

    for action in parser._actions:
        if action.metavar == "DIR":
            setattr(action, "complete", shtab.DIRECTORY)  # noqa: B010 (no such attribute declared)
        elif action.type is Path or action.metavar in PATH_METAVARS:
            setattr(action, "complete", shtab.FILE)  # noqa: B010
    for command in subcommands_of(parser).values():
        complete_paths(command)
