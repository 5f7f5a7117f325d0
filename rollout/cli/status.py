"""`rollout status`: where a run stands, its nodes, what is left and when the plan's
maintenance window next lets it go on; read without taking the run's lock."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from rollout.cli import add_listed_command
from rollout.cli.documents import DOCUMENT_FORMATS, write_document
from rollout.cli.render import make_console, safe
from rollout.errors import ExitCode, RolloutError
from rollout.inputs.inputfile import read_text
from rollout.plan import Plan, plan_from_data
from rollout.run import (
    LockHolder,
    RunOutcome,
    RunPhase,
    RunState,
    default_state_dir,
    latest_run,
    list_runs,
    lock_holder,
    read_plan_json,
    read_run,
    read_run_invocation,
)
from rollout.run.files import find_run_dir
from rollout.run.pause import read_pause, read_schedule_pause
from rollout.schedule.window import next_span
from rollout.spec import parse_spec


def add_status_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`rollout status` (built with apply and resume, which share its --state-dir)."""
    status = add_listed_command(subparsers, "status", "Show a run.")
    status.add_argument("run_id", metavar="RUN", nargs="?", help="default: the latest run")
    status.add_argument("--all", action="store_true", help="list every run")
    status.add_argument(
        "--output",
        "-o",
        choices=("text", "json", "yaml"),
        default="text",
        help="text for a terminal (default); json or yaml for tools",
    )
    add_state_argument(status)
    add_schedule_arguments(
        status.add_argument_group("a scheduled plan's run, kept in the cluster (rollout schedule)"),
        "show the run of the plan named PLAN (metadata.name; or a plan file, whose name is read)"
        " that the scheduled CronJob keeps in the Secret rollout-PLAN-run, the Lease saying "
        "whether a pod works on it",
    )
    status.set_defaults(func=run_status)


def add_schedule_arguments(group: argparse._ArgumentGroup, schedule_help: str) -> None:
    """--schedule PLAN and where its schedule is: --namespace, --kubeconfig, --context."""
    group.add_argument("--schedule", metavar="PLAN", help=schedule_help)
    group.add_argument(
        "--namespace",
        "-n",
        default="rollout",
        help="the schedule's namespace (rollout schedule --namespace; default: rollout)",
    )
    group.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config")
    group.add_argument("--context", help="the kubeconfig context to use")


def add_state_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=state_directory,
        default=None,
        help="where runs are journalled (default: $ROLLOUT_STATE_DIR or ~/.local/state/rollout)",
    )


def state_directory(text: str) -> Path:
    """--state-dir: a directory, or a path where one can be made (argparse reports errors)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} exists and is not a directory; runs are kept in a directory"
        )
    return path


def run_status(args: argparse.Namespace) -> int:
    if args.schedule is not None:
        return cluster_run_status(args)
    state_dir = args.state_dir or default_state_dir()
    console = make_console(sys.stdout)
    if args.all:
        runs: list[dict[str, object]] = []
        for run in list_runs(state_dir):
            if run.phase is None:
                where = f"unreadable: {run.problem}"
            else:
                where = describe_phase(
                    run.run_id, run.phase, run.outcome, run.halted_reason, run.holder
                )
                where = with_pause(state_dir, run.run_id, run.phase, where)
            runs.append({"run_id": run.run_id, "plan": run.plan_name, "status": where})
            if args.output == "text":
                console.print(safe(f"{run.run_id}  {run.plan_name}  {where}"))
        if args.output in DOCUMENT_FORMATS:
            write_document({"runs": runs}, args.output, sys.stdout)
        return ExitCode.OK
    run_id = args.run_id
    if run_id is None:
        latest = latest_run(state_dir)
        if latest is None:
            if args.output in DOCUMENT_FORMATS:
                write_document({"run_id": None}, args.output, sys.stdout)
            else:
                console.print(safe(f"no runs in {state_dir}"))
            return ExitCode.OK
        run_id = latest.run_id
    state = read_run(state_dir, run_id)
    plan = plan_from_data(json.loads(read_plan_json(state_dir, run_id)))
    holder = lock_holder(state_dir, run_id)
    phase = state.phase(locked=holder is not None)
    where = describe_phase(run_id, phase, state.outcome, state.halted_reason, holder)
    where = with_pause(state_dir, run_id, phase, where)
    try:
        invocation = read_run_invocation(state_dir, run_id)
    except RolloutError as exc:
        window = f"; the plan's maintenance window cannot be read: {exc}"
    else:
        window = window_note(invocation.spec_text, invocation.spec_source)
    if args.output in DOCUMENT_FORMATS:
        data = run_status_data(run_id, phase, where, state, plan, window)
        write_document(data, args.output, sys.stdout)
        return ExitCode.OK
    console.print(safe(f"run {run_id}: {where}"))
    print_nodes(console, state, plan, window)
    return ExitCode.OK


def cluster_run_status(args: argparse.Namespace) -> int:
    """The run of a scheduled plan, kept in the cluster (rollout/run/cluster.py)."""
    from rollout.lease import lease_holder, run_identity
    from rollout.run.cluster import find_run, run_object_name
    from rollout.transports.kube import KubeClient

    console = make_console(sys.stdout)
    plan_name = scheduled_plan_name(args.schedule)
    with KubeClient.from_kubeconfig(args.kubeconfig, args.context) as kube:
        found = find_run(kube, args.namespace, plan_name)
        if found is None:
            name = f"{args.namespace}/{run_object_name(plan_name)}"
            if args.output in DOCUMENT_FORMATS:
                write_document({"run_id": None, "secret": name}, args.output, sys.stdout)
                return ExitCode.OK
            console.print(safe(f"no run of plan {plan_name} kept in the cluster (secret {name})"))
            return ExitCode.OK
        holder = lease_holder(kube)
        paused = read_schedule_pause(kube, args.namespace, plan_name)
    state = found.state
    mine = run_identity(found.run_id)
    running = holder is not None and (holder == mine or holder.startswith(mine + "/"))
    phase = state.phase(locked=running)
    match phase:
        case RunPhase.RUNNING:
            where = f"running (the Lease holder is {holder})"
        case RunPhase.FINISHED:
            where = describe_phase(found.run_id, phase, state.outcome, state.halted_reason, None)
        case _:
            stopped = state.halted_reason or "interrupted (its pod stopped)"
            where = f"{phase.value}: {stopped}; the next scheduled run continues it"
    if paused is not None and phase is not RunPhase.FINISHED:
        where = (
            f"{paused.describe()}; every scheduled run exits at once until `rollout unpause "
            f"--schedule {plan_name}` ({where})"
        )
    plan = plan_from_data(json.loads(found.read_plan_json()))
    spec = found.invocation
    window = window_note(spec.spec_text, spec.spec_source)
    if args.output in DOCUMENT_FORMATS:
        data = run_status_data(found.run_id, phase, where, state, plan, window)
        write_document(data | {"kept_in": found.where}, args.output, sys.stdout)
        return ExitCode.OK
    console.print(safe(f"run {found.run_id} ({found.where}): {where}"))
    print_nodes(console, state, plan, window)
    return ExitCode.OK


def scheduled_plan_name(schedule: str) -> str:
    """--schedule PLAN: a plan's name (metadata.name), or a plan file, whose name it reads."""
    path = Path(schedule)
    if schedule == "-" or not path.is_file():
        return schedule
    return parse_spec(read_text(path), schedule).metadata.name


def run_status_data(
    run_id: str, phase: RunPhase, where: str, state: RunState, plan: Plan, window: str
) -> dict[str, object]:
    """What `status -o json|yaml` writes: the run, where it stands and each node's steps."""
    nodes = []
    for node in plan.nodes:
        ns = state.node(node.name)
        nodes.append(
            {
                "name": node.name,
                "outcome": ns.outcome.value if ns.outcome else None,
                "reason": ns.outcome_reason or None,
                "steps_done": len(ns.completed),
                "steps": len(node.steps),
                "in_flight": ns.in_flight.kind if ns.in_flight else None,
                "cordoned_by_rollout": bool(ns.cordoned_by_rollout),
            }
        )
    return {
        "run_id": run_id,
        "plan": plan.name,
        "phase": phase.value,
        "outcome": state.outcome.value if state.outcome else None,
        "halted_reason": state.halted_reason,
        "status": where,
        "nodes": nodes,
        "nodes_left": sum(1 for n in nodes if n["outcome"] is None),
        "window": window.removeprefix("; ") or None,
    }


def print_nodes(console: Console, state: RunState, plan: Plan, window: str) -> None:
    """Each node's outcome and steps, then the nodes left and the maintenance window."""
    for node in plan.nodes:
        ns = state.node(node.name)
        done = len(ns.completed)
        flying = f", in flight: {ns.in_flight.kind}" if ns.in_flight else ""
        result = ns.outcome.value if ns.outcome else "pending"
        reason = f" ({ns.outcome_reason})" if ns.outcome_reason else ""
        cordoned = ", cordoned by rollout" if ns.cordoned_by_rollout else ""
        console.print(
            safe(
                f"  {node.name}: {result}{reason}; {done}/{len(node.steps)} steps{flying}{cordoned}"
            )
        )
    left = sum(1 for n in plan.nodes if state.node(n.name).outcome is None)
    if left and state.outcome is None:
        console.print(safe(f"{left} node(s) left{window}"))


def window_note(spec_text: str, spec_source: str, now: datetime | None = None) -> str:
    """When the plan's maintenance window is open until, or next opens ("" without one)."""
    try:
        window = parse_spec(spec_text, spec_source).policy.maintenance_window
    except RolloutError as exc:
        return f"; the plan's maintenance window cannot be read: {exc}"
    if window is None:
        return ""
    moment = now or datetime.now(UTC)
    span = next_span(window, moment)
    if span.holds(moment):
        closes = span.closes.astimezone(window.zone)
        return f"; the maintenance window is open until {closes:%H:%M %Z}"
    opens = span.opens.astimezone(window.zone)
    return f"; the next maintenance window opens {opens:%a %Y-%m-%d %H:%M %Z}"


def with_pause(state_dir: Path, run_id: str, phase: RunPhase, where: str) -> str:
    """Where a run stands, said first as who paused it and why when it is paused."""
    mark = read_pause(find_run_dir(state_dir, run_id))
    if mark is None or phase is RunPhase.FINISHED:
        return where
    if phase is RunPhase.RUNNING:
        return f"{mark.describe()}; its nodes in flight finish, no node starts ({where})"
    return f"{mark.describe()}; `rollout resume {run_id}` clears it and continues"


def describe_phase(
    run_id: str,
    phase: RunPhase,
    outcome: RunOutcome | None,
    halted_reason: str | None,
    holder: LockHolder | None,
) -> str:
    """Where a run stands, in words, and what to do about it."""
    resume = f"continue with `rollout resume {run_id}`"
    match phase:
        case RunPhase.FINISHED:
            text = outcome.value if outcome else "finished"
            return text + (f" ({halted_reason})" if halted_reason else "")
        case RunPhase.HALTED:
            return f"halted: {halted_reason}; {resume} once that is dealt with"
        case RunPhase.RUNNING:
            return f"running ({holder or 'a live process'} holds it)"
        case RunPhase.INTERRUPTED:
            return f"interrupted (no process holds it); {resume}"
