"""`rollout apply`, `rollout resume` and `rollout status`: run a plan, continue it, show it."""

from __future__ import annotations

import argparse
import functools
import json
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rollout.cli import add_listed_command
from rollout.cli.documents import DOCUMENT_FORMATS, write_document
from rollout.cli.pause import scheduled_run_paused, unpause_for_resume
from rollout.cli.plan import add_fleet_arguments, connect_fleet, limit_of
from rollout.cli.render import (
    LiveProgress,
    ProgressLines,
    make_console,
    print_plan_text,
    safe,
)
from rollout.cli.runsummary import report_run
from rollout.cli.schedule import check_same_plan, pod_run_place, stopping_on_sigterm
from rollout.cli.status import add_state_argument, add_status_parser
from rollout.connection import FleetConnection
from rollout.errors import Aborted, BadInput, ExitCode
from rollout.executor import Executor, RunReport
from rollout.facts import FleetFacts
from rollout.facts.live import gather_fleet_facts
from rollout.inputs.inputfile import input_name, read_text
from rollout.lease import RunLease, run_identity
from rollout.notify.progress import start_notifying
from rollout.plan import NodePlan, Plan, plan_from_data, plan_to_data
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.retry import RetryEvent, watch_retries
from rollout.run import (
    Invocation,
    Journal,
    NodeSkipped,
    Retried,
    RunOutcome,
    RunResumed,
    current_user,
    default_state_dir,
    make_run_id,
    utc_now,
)
from rollout.run.cluster import find_run, open_run, start_run
from rollout.run.pause import describe_pause_of
from rollout.savedplan import is_saved_plan, read_saved_plan, saved_plan_data
from rollout.savedplan.document import is_saved_plan_text, saved_plan_from_text
from rollout.savedplan.gate import admit_node, saved_plan_gate
from rollout.spec import Spec, parse_spec
from rollout.steps import builtin_steps
from rollout.steps.base import StepContext
from rollout.testclock import run_clock

APPLY_HELP = (
    "Plan as `rollout plan` does, show it, ask, then apply it node by node, wave by "
    "wave. Every step is journalled under the state directory; a run killed at any "
    "point continues with `rollout resume RUN`. One run per cluster at a time (a "
    "Lease in kube-system). A failed node is rolled back (policy.on_failure) and the "
    "run halts; any node labelled nvidia.com/gpu-driver-upgrade-state=upgrade-failed "
    "halts it before the next node. With policy.maintenance_window no node starts "
    "outside the window, nor one that the longest node of the run so far says would "
    "not finish before it closes; the nodes in flight finish.\n\n"
    "Exit status: 0 done, 1 failed or halted, 2 bad input, 3 not confirmed, 4 stopped "
    "at the window's end (`rollout resume RUN` in the next window continues)."
)

RESUME_HELP = (
    "Continue RUN from its journal: finished steps are not redone, the step that was "
    "in flight is checked again against fresh facts. Uses the plan as it was when the "
    "run started."
)


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    apply = add_listed_command(subparsers, "apply", APPLY_HELP, as_written=True)
    apply.add_argument(
        "plan_file", metavar="PLAN", type=Path, help="a plan.yaml, a saved plan, or - (stdin)"
    )
    add_fleet_arguments(apply)
    apply.add_argument("--yes", "-y", action="store_true", help="skip the confirmation")
    add_output_argument(apply)
    add_state_argument(apply)
    apply.set_defaults(func=run_apply)

    resume = add_listed_command(subparsers, "resume", RESUME_HELP)
    resume.add_argument("run_id", metavar="RUN")
    resume.add_argument(
        "--skip-node",
        metavar="NODE",
        action="append",
        default=[],
        help="leave NODE out of the rest of the run (a node that died and will not come "
        "back): it is not probed or touched, the journal records the skip and who asked, and "
        "the step it was in stays unknown (check the node by hand); repeatable",
    )
    add_output_argument(resume)
    add_state_argument(resume)
    resume.set_defaults(func=run_resume)

    add_status_parser(subparsers)


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        "-o",
        choices=("text", "json", "yaml"),
        default="text",
        help="text: the plan, live progress and a summary table; json or yaml: one report on "
        "stdout (progress lines still go to stderr)",
    )


def run_apply(args: argparse.Namespace) -> int:
    recorder = RetryRecorder()
    with watch_retries(recorder), stopping_on_sigterm():
        return apply_plan(args, recorder)


def apply_plan(args: argparse.Namespace, recorder: RetryRecorder) -> int:
    if args.inventory is None:
        raise BadInput("rollout apply needs --inventory FILE (the nodes to reach over SSH)")
    # a saved plan (rollout plan --out) runs as saved: its spec, its plan, node by node
    # refused when its facts moved (rollout.savedplan)
    saved = read_saved_plan(args.plan_file) if is_saved_plan(args.plan_file) else None
    # read once: the text journalled below is the text planned, even if the file changes
    spec_text = read_text(args.plan_file) if saved is None else saved.spec_text
    if saved is None and is_saved_plan_text(spec_text):  # `apply -` given a saved plan
        saved = saved_plan_from_text(spec_text, input_name(args.plan_file))
        spec_text = saved.spec_text
    source = input_name(args.plan_file) if saved is None else saved.spec_source
    spec = parse_spec(spec_text, source)
    if saved is not None and args.limit is not None:  # not silently ignored: refused
        raise BadInput(
            f"--limit with the saved plan {args.plan_file}: a saved plan runs as it was"
            " reviewed; plan again with --limit and save that (rollout plan PLAN --limit"
            " ... --out FILE)"
        )
    limit = limit_of(args)  # bad input: nothing probed
    console = make_console(sys.stdout)
    pod = pod_run_place(args)
    with connect_fleet(args) as fleet:
        if pod is not None:
            if scheduled_run_paused(fleet.kube, pod.namespace, spec.metadata.name):
                return ExitCode.PAUSED
            found = find_run(fleet.kube, pod.namespace, spec.metadata.name)
            if found is not None and not found.state.finished:
                check_same_plan(found, spec_text, args.plan_file)
                print(f"continuing run {found.run_id} ({found.where})", file=sys.stderr)
                with open_run(fleet.kube, pod.namespace, spec.metadata.name) as journal:
                    recorder.attach(journal)
                    plan = plan_from_data(json.loads(journal.read_plan_json()))
                    try:
                        report = continue_run(journal, spec, plan, fleet, [], args.output, pod.name)
                    finally:
                        recorder.detach()
                pod.announce(fleet.kube, plan.name, found.run_id, report)
                return exit_code(report)
        facts = fleet.gather(spec, max_parallel=args.parallel)
        plan = (
            saved.plan
            if saved is not None
            else build_plan(spec, source, facts, load_playbooks(), limit)
        )
        if args.output == "text":
            print_plan_text(plan, console)
        if not plan.has_changes:
            if args.output in DOCUMENT_FORMATS:
                nothing = {"run_id": None, "outcome": "no-changes"}
                write_document(nothing, args.output, sys.stdout)
            return ExitCode.OK
        confirm(args.yes)
        invocation = Invocation(
            spec_source=input_name(args.plan_file),
            spec_text=spec_text,
            inventory=str(args.inventory.resolve()),
            kubeconfig=args.kubeconfig,
            context=args.context,
            accept_new_host_keys=args.accept_new_host_keys,
        )
        # The Lease first, under the id the run will have: an apply refused by it (another
        # run works on this cluster) leaves no run behind.
        run_id = make_run_id(plan.name, utc_now())
        plan_json = json.dumps(plan_to_data(plan) | saved_plan_data(saved))
        if pod is not None:
            identity = run_identity(run_id, pod.name)
            begin: Callable[[], Journal] = functools.partial(
                start_run,
                fleet.kube,
                pod.namespace,
                plan.name,
                plan_json,
                invocation=invocation,
                run_id=run_id,
            )
            kept = f"kept in {pod.where(plan.name)}; the next scheduled run continues it"
        else:
            identity = run_identity(run_id)
            begin = functools.partial(
                Journal.create,
                args.state_dir or default_state_dir(),
                plan.name,
                plan_json,
                invocation=invocation,
                run_id=run_id,
            )
            kept = f"resume with: rollout resume {run_id}"
        with RunLease(fleet.kube, identity) as lease, begin() as journal:
            print(f"run {run_id} ({kept})", file=sys.stderr)
            recorder.attach(journal)
            try:
                report = execute(plan, spec, facts, fleet, journal, lease, args.output)
            finally:
                # the journal closes before the Lease is released: retries of the release
                # are shown, not journalled
                recorder.detach()
        if pod is not None:
            pod.announce(fleet.kube, plan.name, run_id, report)
    return exit_code(report)


def run_resume(args: argparse.Namespace) -> int:
    recorder = RetryRecorder()
    with watch_retries(recorder), stopping_on_sigterm():
        return resume_run(args, recorder)


def resume_run(args: argparse.Namespace, recorder: RetryRecorder) -> int:
    state_dir = args.state_dir or default_state_dir()
    console = make_console(sys.stdout)
    with Journal.open(state_dir, args.run_id) as journal:
        recorder.attach(journal)
        if journal.replay().finished:
            console.print(f"run {args.run_id} already finished; nothing to resume")
            return ExitCode.OK
        unpause_for_resume(journal)
        invocation = journal.read_invocation()
        spec = parse_spec(invocation.spec_text, invocation.spec_source)
        plan = plan_from_data(json.loads(journal.read_plan_json()))
        skipped = check_skipped_nodes(plan, journal, args.skip_node)
        with FleetConnection(
            Path(invocation.inventory),
            invocation.kubeconfig,
            invocation.context,
            accept_new_host_keys=invocation.accept_new_host_keys,
        ) as fleet:
            report = continue_run(journal, spec, plan, fleet, skipped, args.output)
    return exit_code(report)


def continue_run(
    journal: Journal,
    spec: Spec,
    plan: Plan,
    fleet: FleetConnection,
    skipped: list[str],
    output: str,
    pod: str | None = None,
) -> RunReport:
    """Go on with a run from its journal (resume, or the next scheduled run in a pod)."""
    if skipped:  # a skipped node is not probed: it is the one that does not answer
        reachable = {n: r for n, r in fleet.runners.items() if n not in skipped}
        source = str(fleet.inventory_path)
        facts = gather_fleet_facts(spec, reachable, fleet.kube, source=source)
    else:
        facts = fleet.gather(spec)
    # Journalled only once the Lease is held: a refused resume leaves the run as it
    # was (a halted run stays halted, with its reason).
    with RunLease(fleet.kube, run_identity(journal.run_id, pod)) as lease:
        journal.append(RunResumed(user=current_user(), host=socket.gethostname()))
        for node in skipped:
            reason = f"skipped at resume by {current_user()} (--skip-node)"
            journal.append(NodeSkipped(node, reason))
            print(f"{node}: {reason}", file=sys.stderr)
        print(f"resuming run {journal.run_id}", file=sys.stderr)
        return execute(plan, spec, facts, fleet, journal, lease, output)


class RetryRecorder:
    """Every retry of this process: a progress line as it happens, and a journal record so
    the summary (and a resumed run) counts it; retries before the run's journal exists
    (taking the Lease) are journalled once it does."""

    def __init__(self) -> None:
        self._console = make_console(sys.stderr)
        self._journal: Journal | None = None
        self._waiting: list[Retried] = []
        self._detached = False
        self._lock = threading.Lock()

    def __call__(self, event: RetryEvent) -> None:
        self._console.print(safe(f"  ↻ {event.describe()}"))
        first_line = (str(event.error).splitlines() or [""])[0]
        record = Retried(event.operation, event.retry, event.kind, first_line[:300])
        with self._lock:
            journal = self._journal
            if journal is None:
                if not self._detached:
                    self._waiting.append(record)
                return
        journal.append(record)

    def detach(self) -> None:
        """The journal is about to close: later retries are shown only."""
        with self._lock:
            self._journal, self._detached, self._waiting = None, True, []

    def attach(self, journal: Journal) -> None:
        with self._lock:
            self._journal, waiting, self._waiting = journal, self._waiting, []
        for record in waiting:
            journal.append(record)


def check_skipped_nodes(plan: Plan, journal: Journal, nodes: list[str]) -> list[str]:
    """The --skip-node names, each a node of the run that has not finished; BadInput if not."""
    state = journal.replay()
    names = [n.name for n in plan.nodes]
    for node in nodes:
        if node not in names:
            raise BadInput(
                f"--skip-node {node}: not a node of run {journal.run_id} "
                f"(its nodes: {', '.join(names)})"
            )
        outcome = state.node(node).outcome
        if outcome is not None:
            raise BadInput(f"--skip-node {node}: the node already finished ({outcome.value})")
    return list(dict.fromkeys(nodes))


def execute(
    plan: Plan,
    spec: Spec,
    facts: FleetFacts,
    fleet: FleetConnection,
    journal: Journal,
    lease: RunLease,
    output: str,
) -> RunReport:
    """Run the executor with the built-in steps, under a lease the caller holds."""
    progress_console = make_console(sys.stderr)

    def say(text: str) -> None:
        progress_console.print(safe(text))

    live = output == "text" and sys.stderr.isatty()
    waves = {node.name: wave.index for wave in plan.waves for node in wave.nodes}
    gate = saved_plan_gate(journal.read_plan_json())  # a run of a saved plan
    progress: LiveProgress | ProgressLines = (
        LiveProgress(progress_console, waves) if live else ProgressLines(progress_console)
    )

    def context(node: NodePlan) -> StepContext:
        node_facts = facts.by_name(node.name)
        if node_facts is None:
            raise BadInput(f"{node.name} is in the plan but not in the inventory")
        if gate is not None:  # read again, compared with the saved digests
            runner = fleet.runners[node.name]
            node, node_facts = admit_node(gate, node, spec, runner, fleet.kube, journal)
        return StepContext(
            node=node.name,
            node_plan=node,
            facts=node_facts,
            spec=spec,
            runner=fleet.runners[node.name],
            kube=fleet.kube,
            journal=journal,
            # the steps name the node in their own lines
            progress=say,
        )

    notifying = start_notifying(  # policy.notify: the Progress also tells the webhooks
        progress, spec, journal, fleet.kube, waves, say
    )
    executor = Executor(
        plan,
        spec,
        builtin_steps(),
        journal,
        fleet.kube,
        context,
        notifying or progress,
        lease,
        clock=run_clock(),
        say=say,
        paused=lambda: describe_pause_of(journal, fleet.kube, plan.name),
    )

    if isinstance(progress, LiveProgress):
        with progress:
            report = executor.run()
    else:
        report = executor.run()
    if notifying is not None:  # the last notices, then a flush of at most FLUSH_BOUND_S
        notifying.finish(report)
    report_run(plan, spec, report, journal, fleet.runners, output, say)
    return report


def confirm(yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise Aborted("not confirmed: stdin is not a terminal; pass --yes to apply without asking")
    answer = input("Apply this plan? Type 'yes' to go on: ")
    if answer.strip().lower() != "yes":
        raise Aborted("not confirmed; nothing was changed")


def exit_code(report: RunReport) -> int:
    if report.window_closed or report.paused:
        return ExitCode.WINDOW_CLOSED if report.window_closed else ExitCode.PAUSED
    return ExitCode.OK if report.outcome is RunOutcome.SUCCEEDED else ExitCode.FAILED
