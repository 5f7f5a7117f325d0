"""The `rollout` command line: argument parsing, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rollout import __version__
from rollout.errors import ExitCode, RolloutError

DESCRIPTION = """\
Plan and apply changes across the GPU nodes of Kubernetes clusters that run the NVIDIA GPU
Operator: containerd settings (registry mirrors, runtime options), device-plugin time-slicing
profiles and GPU driver versions.

rollout knows what containerd will actually load: on containerd 1.x a drop-in that touches the
CRI plugin replaces the whole CRI table, so a three-line registry drop-in can silently delete
the `nvidia` runtime handler. `rollout plan` shows the effective containerd config before and
after every write, and names any file that shadows another.
"""

EPILOG = """\
examples:
  rollout plan examples/plan.yaml --facts examples/facts
  rollout plan examples/plan.yaml --facts examples/facts --output json --detailed-exitcode
  rollout lab up --nodes 4 --containerd 1.6,1.7,2.1,1.7

exit codes: 0 ok (plan: no change with --detailed-exitcode), 1 a node failed or the run halted,
2 bad input (plan: changes pending with --detailed-exitcode), 3 aborted
"""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    from rollout.cli import apply, lab, plan

    parser = argparse.ArgumentParser(
        prog="rollout",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rollout {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    plan.add_parser(subparsers)
    apply.add_parsers(subparsers)
    lab.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        code: int = args.func(args)
    except RolloutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if getattr(args, "detailed_exitcode", False):
            # with --detailed-exitcode, 2 means "changes pending": every error is 1
            return ExitCode.FAILED
        return exc.exit_code
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return ExitCode.ABORTED
    return code
