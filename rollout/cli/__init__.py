"""The `rollout` command line: argument parsing, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass

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
examples (rollout init writes plan.yaml, inventory/ and facts/ to try them on):
  rollout init starter && cd starter
  rollout plan plan.yaml --facts facts
  rollout plan plan.yaml --facts facts --output json --detailed-exitcode
  rollout lab up --nodes 4 --containerd 1.6,1.7,2.1,1.7

exit statuses:
  0  ok; plan --detailed-exitcode: nothing would change
  1  a node failed or the run halted (or an internal error); with --detailed-exitcode, any error
  2  bad input: a plan, inventory, option or command rollout cannot use;
     plan --detailed-exitcode: changes pending
  3  aborted: the confirmation declined, or Ctrl-C
  4  apply/resume stopped at the end of the plan's maintenance window; resume continues
  5  apply/resume stopped by `rollout pause`: nodes in flight finished; resume continues
  141  the output's reader went away (`rollout plan | head`), said quietly as SIGPIPE's
Bad input is reported one problem a line, at file:line; see docs/input-contract.md.
"""


@dataclass(frozen=True)
class Command:
    """A subcommand as `rollout --help` lists it, and the module whose `register` builds it."""

    name: str
    help: str
    module: str
    register: str = "add_parser"


# Every subcommand, in the order `rollout --help` lists them. Only the module of the command
# being run is imported: each pulls in its libraries (rich, pydantic, kubernetes, fabric), and
# `rollout --help` needs none of them. A module builds its commands with add_listed_command,
# which gives each the help line listed here (tests/unit/test_startup.py checks that the
# listing and the built parsers read the same).
COMMANDS = (
    Command("plan", "show what would change (dry run)", "rollout.cli.plan"),
    Command("show", "render a plan saved with `rollout plan --out FILE`", "rollout.cli.show"),
    Command(
        "apply",
        "apply a plan: waves of cordon, drain, write, restart, verify, uncordon",
        "rollout.cli.apply",
        "add_parsers",
    ),
    Command(
        "resume",
        "continue an interrupted or halted run where it stopped",
        "rollout.cli.apply",
        "add_parsers",
    ),
    Command(
        "status", "show runs, or one run's nodes and steps", "rollout.cli.apply", "add_parsers"
    ),
    Command(
        "pause",
        "stop a run from starting nodes (who and why kept)",
        "rollout.cli.pause",
        "add_parsers",
    ),
    Command("unpause", "clear a run's pause", "rollout.cli.pause", "add_parsers"),
    Command(
        "lab",
        "a local lab cluster (systemd-nspawn nodes, emulated Kubernetes API)",
        # the lab is apart from the product: named here, imported only when `lab` runs
        "rollout.lab.cli",
    ),
    Command(
        "diagnose", "find why GPU pods or nodes do not work (read-only)", "rollout.cli.diagnose"
    ),
    Command("facts", "record facts for offline plan and diagnose", "rollout.cli.facts"),
    Command(
        "schedule",
        "Kubernetes manifests (CronJob, least-privilege RBAC) for scheduled waves",
        "rollout.cli.schedule",
    ),
    Command(
        "init",
        "write a starter plan, inventories and recorded facts to try rollout on",
        "rollout.cli.init",
    ),
    Command(
        "version",
        "print the version, the commit of the build and the Python running it",
        "rollout.cli.version",
    ),
    Command(
        "completion",
        "print a bash or zsh completion script",
        "rollout.cli.completion",
    ),
)


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    description: str | None = None,
    epilog: str | None = None,
    *,
    help: str,
    as_written: bool = False,
) -> argparse.ArgumentParser:
    """A (sub)command's parser: `help` is its line in its parent's help; `description` and
    `epilog` are wrapped by argparse, or, `as_written`, kept as laid out in lines and lists."""
    return subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=(
            argparse.RawDescriptionHelpFormatter if as_written else argparse.HelpFormatter
        ),
    )


def add_listed_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    description: str | None = None,
    epilog: str | None = None,
    *,
    as_written: bool = False,
) -> argparse.ArgumentParser:
    """A top-level command's parser, with the help line `rollout --help` lists for it."""
    (listed,) = (command for command in COMMANDS if command.name == name)
    return add_command(
        subparsers, name, description, epilog, help=listed.help, as_written=as_written
    )


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser: `commands` built in full (None: every one), the rest listed only.

    A listed command has its name and help, enough for `rollout --help` and for argparse to
    name the valid choices; main() builds in full the command it is about to run.
    """
    parser = argparse.ArgumentParser(
        prog="rollout",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rollout {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an internal error, print Python's traceback (for a bug report)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    built = {c.module for c in COMMANDS if commands is None or c.name in commands}
    for command in COMMANDS:  # in order: a module registers its commands together
        if command.name in subparsers.choices:
            continue
        if command.module in built:
            getattr(importlib.import_module(command.module), command.register)(subparsers)
        else:
            subparsers.add_parser(command.name, help=command.help)
    return parser


def command_of(words: Sequence[str]) -> str | None:
    """The subcommand a command line runs: its first word that is not an option."""
    return next((word for word in words if not word.startswith("-")), None)


def output_closed() -> bool:
    """Whether standard output is a pipe whose reader closed it (Linux reports POLLERR on
    the write end), rather than some other broken pipe (a socket) failing."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def reader_gone() -> int:
    """The process's output pipe closed under it (`rollout plan | head -1`): nothing failed,
    the reader stopped reading. Later writes (and the interpreter's flush at exit) go nowhere
    and the status is a SIGPIPE death's, 128 + 13, as git's or grep's."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        # a stream without a descriptor (a test's capture) has nothing to redirect
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    return ExitCode.READER_GONE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    from rollout.cli.mistyped import mistyped_command, option_elsewhere

    words = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere on the line, not only before the command
    debug = "--debug" in words
    words = [word for word in words if word != "--debug"]
    # with --detailed-exitcode, 2 means "changes pending": every error is 1
    detailed = "--detailed-exitcode" in words
    parser = build_parser({command_of(words) or ""})
    mistake = mistyped_command(parser, words) or option_elsewhere(command_of(words), words)
    if mistake is not None:
        print(f"rollout: error: {mistake}", file=sys.stderr)
        return ExitCode.FAILED if detailed else ExitCode.BAD_INPUT
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse's usage errors (2), --help and --version (0)
        code = exc.code if isinstance(exc.code, int) else ExitCode.BAD_INPUT
        return ExitCode.FAILED if detailed and code == ExitCode.BAD_INPUT else code
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        code = int(args.func(args))
    except RolloutError as exc:
        from rollout.cli.render import show_controls

        # messages quote input (paths, names, values): controls print, they do not act
        print(f"error: {show_controls(str(exc))}", file=sys.stderr)
        return ExitCode.FAILED if detailed else exc.exit_code
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return ExitCode.ABORTED
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and output_closed():
            return reader_gone()
        from rollout.cli.render import show_controls
        from rollout.inputs.fieldproblems import shorten

        # a bug in rollout, not bad input: say so, and where the details are
        if debug:
            traceback.print_exc(file=sys.stderr)
        # the text on one line, bounded: it may quote hostile input
        text = shorten(" ".join(str(exc).split()), 300)
        print(
            f"internal error: {type(exc).__name__}: {show_controls(text)}\n"
            "  this is a bug in rollout, please report it"
            + ("" if debug else "; run again with --debug for the traceback"),
            file=sys.stderr,
        )
        return ExitCode.FAILED
    return code
