"""`rollout pause` and `rollout unpause`: stop a run from starting nodes, and let it.

A pause takes no lock (the run holds its journal's): it leaves a mark where the run is kept
(rollout/run/pause.py) that the run reads before it starts each node. The nodes in flight
finish, no node starts, and the run exits with status 5; `rollout resume RUN` clears the mark
and continues, `rollout unpause` only clears it. For a scheduled plan (`--schedule PLAN`)
every scheduled run started while the mark is there exits 5 at once.
"""

from __future__ import annotations

import argparse
import socket
import sys

from rollout.cli import add_listed_command
from rollout.cli.render import make_console, safe
from rollout.cli.status import add_schedule_arguments, add_state_argument, scheduled_plan_name
from rollout.errors import BadInput, ExitCode
from rollout.run import Journal, current_user, default_state_dir, read_run, utc_now
from rollout.run.files import find_run_dir
from rollout.run.pause import (
    ConfigMapApi,
    PauseMark,
    clear_pause,
    mark_schedule_paused,
    pause_run,
    plan_configmap_name,
    read_schedule_pause,
)
from rollout.transports.errors import NotFound

PAUSE_HELP = (
    "Mark a run paused, with who and why: its nodes in flight finish, no node starts, and "
    "the run exits with status 5; `rollout status` says who paused it. It holds across a "
    "kill -9 of the run and the loss of its Lease, until `rollout resume RUN` (which clears "
    "it and continues) or `rollout unpause`. With --schedule PLAN, every scheduled run of the "
    "plan exits 5 at once until `rollout unpause --schedule PLAN`."
)


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pause = add_listed_command(subparsers, "pause", PAUSE_HELP)
    pause.add_argument("--reason", required=True, help="why, for whoever finds it paused")
    add_run_arguments(pause)
    pause.set_defaults(func=run_pause)
    unpause = add_listed_command(
        subparsers,
        "unpause",
        "Clear a run's pause; `rollout resume RUN` (or the next scheduled run) continues it.",
    )
    add_run_arguments(unpause)
    unpause.set_defaults(func=run_unpause)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", nargs="?", help="a run kept in a directory")
    add_state_argument(parser)
    add_schedule_arguments(
        parser.add_argument_group("a scheduled plan (rollout schedule)"),
        "the plan named PLAN (metadata.name; or a plan file, whose name is read): the mark is"
        " kept on its ConfigMap rollout-PLAN",
    )


def mark_of(args: argparse.Namespace) -> PauseMark:
    return PauseMark(f"{current_user()}@{socket.gethostname()}", args.reason, utc_now())


def run_pause(args: argparse.Namespace) -> int:
    console = make_console(sys.stdout)
    if scheduled(args):
        plan_name = scheduled_plan_name(args.schedule)
        mark = mark_of(args)
        set_schedule_pause(args, plan_name, mark)
        console.print(
            safe(
                f"plan {plan_name} {mark.describe()}: a run going on finishes its nodes in "
                "flight and starts none; every scheduled run exits at once until `rollout "
                f"unpause --schedule {plan_name}`"
            )
        )
        return ExitCode.OK
    state_dir = args.state_dir or default_state_dir()
    run_dir = find_run_dir(state_dir, args.run_id)
    if read_run(state_dir, args.run_id).finished:
        console.print(safe(f"run {args.run_id} already finished; nothing to pause"))
        return ExitCode.OK
    mark = mark_of(args)
    pause_run(run_dir, mark)
    console.print(
        safe(
            f"run {args.run_id} {mark.describe()}: its nodes in flight finish, no node "
            f"starts; `rollout resume {args.run_id}` continues it"
        )
    )
    return ExitCode.OK


def run_unpause(args: argparse.Namespace) -> int:
    console = make_console(sys.stdout)
    if scheduled(args):
        what = f"plan {scheduled_plan_name(args.schedule)}"
        mark = set_schedule_pause(args, scheduled_plan_name(args.schedule), None)
        goes_on = "the next scheduled run continues it"
    else:
        what = f"run {args.run_id}"
        mark = clear_pause(find_run_dir(args.state_dir or default_state_dir(), args.run_id))
        goes_on = f"`rollout resume {args.run_id}` continues it"
    if mark is None:
        console.print(safe(f"{what} is not paused"))
    else:
        console.print(safe(f"{what} unpaused (was {mark.describe()}); {goes_on}"))
    return ExitCode.OK


def scheduled(args: argparse.Namespace) -> bool:
    """Whether the command is about a scheduled plan; BadInput unless exactly one is named."""
    if (args.run_id is None) == (args.schedule is None):
        raise BadInput("name a run (RUN) or a scheduled plan (--schedule PLAN), one of them")
    return args.schedule is not None


def set_schedule_pause(
    args: argparse.Namespace, plan_name: str, mark: PauseMark | None
) -> PauseMark | None:
    # here, not at the top: the kubernetes client is for --schedule only
    from rollout.transports.kube import KubeClient

    with KubeClient.from_kubeconfig(args.kubeconfig, args.context) as kube:
        try:
            return mark_schedule_paused(kube, args.namespace, plan_name, mark)
        except NotFound as exc:
            name = f"{args.namespace}/{plan_configmap_name(plan_name)}"
            raise BadInput(
                f"configmap {name} not found: is plan {plan_name} scheduled in namespace "
                f"{args.namespace} (rollout schedule, --namespace)?"
            ) from exc


def scheduled_run_paused(kube: ConfigMapApi, namespace: str, plan_name: str) -> bool:
    """Whether the scheduled plan is paused (a scheduled run then exits at once), said why."""
    mark = read_schedule_pause(kube, namespace, plan_name)
    if mark is not None:
        print(
            f"plan {plan_name} {mark.describe()}: nothing started; `rollout unpause --schedule "
            f"{plan_name}` lets the next scheduled run go on",
            file=sys.stderr,
        )
    return mark is not None


def unpause_for_resume(journal: Journal) -> None:
    """`rollout resume RUN` clears the run's pause, saying whose it was."""
    mark = clear_pause(journal.run_dir)
    if mark is not None:
        print(f"unpaused: the run was {mark.describe()}", file=sys.stderr)
