"""`rollout pause RUN` and `rollout unpause RUN`: stop a run from starting nodes, and let it.

A pause takes no lock (the run holds its journal's): it leaves a mark beside the journal that
the run reads before it starts each node. The nodes in flight finish, no node starts, and the
run exits with status 5; `rollout resume RUN` clears the mark and continues, `rollout unpause
RUN` only clears it.
"""

from __future__ import annotations

import argparse
import socket
import sys

from rollout.cli import add_listed_command
from rollout.cli.render import make_console, safe
from rollout.cli.status import add_state_argument
from rollout.errors import ExitCode
from rollout.run import current_user, default_state_dir, read_run, utc_now
from rollout.run.files import find_run_dir
from rollout.run.pause import PauseMark, clear_pause, pause_run

PAUSE_HELP = (
    "Mark a run paused, with who and why: its nodes in flight finish, no node starts, and "
    "the run exits with status 5; `rollout status` says who paused it. It holds across a "
    "kill -9 of the run and the loss of its Lease, until `rollout resume RUN` (which clears "
    "it and continues) or `rollout unpause RUN`."
)


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pause = add_listed_command(subparsers, "pause", PAUSE_HELP)
    pause.add_argument("run_id", metavar="RUN")
    pause.add_argument("--reason", required=True, help="why, for whoever finds it paused")
    add_state_argument(pause)
    pause.set_defaults(func=run_pause)
    unpause = add_listed_command(
        subparsers, "unpause", "Clear a run's pause; `rollout resume RUN` continues it."
    )
    unpause.add_argument("run_id", metavar="RUN")
    add_state_argument(unpause)
    unpause.set_defaults(func=run_unpause)


def run_pause(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    run_dir = find_run_dir(state_dir, args.run_id)
    console = make_console(sys.stdout)
    if read_run(state_dir, args.run_id).finished:
        console.print(safe(f"run {args.run_id} already finished; nothing to pause"))
        return ExitCode.OK
    mark = PauseMark(f"{current_user()}@{socket.gethostname()}", args.reason, utc_now())
    pause_run(run_dir, mark)
    console.print(
        safe(
            f"run {args.run_id} {mark.describe()}: its nodes in flight finish, no node "
            f"starts; `rollout resume {args.run_id}` continues it"
        )
    )
    return ExitCode.OK


def run_unpause(args: argparse.Namespace) -> int:
    run_dir = find_run_dir(args.state_dir or default_state_dir(), args.run_id)
    mark = clear_pause(run_dir)
    console = make_console(sys.stdout)
    if mark is None:
        console.print(safe(f"run {args.run_id} is not paused"))
    else:
        console.print(
            safe(
                f"run {args.run_id} unpaused (was {mark.describe()}); `rollout resume "
                f"{args.run_id}` continues it"
            )
        )
    return ExitCode.OK
