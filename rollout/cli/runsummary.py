"""The end of a run of `rollout apply` and `rollout resume`: what the change kinds leave on the
nodes removed, then the summary (text, or a JSON/YAML document) with the kinds' notes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping

from rollout.changes import kind_planners
from rollout.changes.base import ChangeKindPlanner, clean_up_run, run_notes
from rollout.cli.documents import DOCUMENT_FORMATS, write_document
from rollout.cli.render import make_console, print_run_summary, report_to_json, safe
from rollout.commands import CommandRunner
from rollout.executor import RunReport
from rollout.plan import Plan
from rollout.run import Journal
from rollout.spec import Spec


def report_run(
    plan: Plan,
    spec: Spec,
    report: RunReport,
    journal: Journal,
    runners: Mapping[str, CommandRunner],
    output: str,
    say: Callable[[str], None],
    kinds: Mapping[str, ChangeKindPlanner] | None = None,
) -> None:
    """The end of a run: what the change kinds leave on the nodes removed (`clean_up_run`),
    then the summary with the kinds' notes (`run_notes`: a driver change's nodes left pinned,
    the way back), on stdout; `say` tells, by node, what could not be removed (the progress
    lines)."""
    planners = kind_planners() if kinds is None else kinds
    state = journal.replay()
    retries = dict(state.retries)
    outcome = report.outcome.value
    cleanup = clean_up_run(planners, plan, spec, runners, str(journal.run_id))
    for node, problem in cleanup.items():
        say(f"{node}: {problem}")
    notes = run_notes(planners, plan, spec, outcome, state)
    if output in DOCUMENT_FORMATS:
        document = json.loads(report_to_json(str(journal.run_id), report))
        document["retries"] = retries
        if notes:
            document["notes"] = notes
        write_document(document, output, sys.stdout)
        return
    out = make_console(sys.stdout)
    print_run_summary(out, str(journal.run_id), outcome, report.halt_reason, report.nodes)
    out.print(safe(describe_retries(retries)))
    for note in notes:  # said loudly
        out.print(f"[bold yellow]{safe(note)}[/bold yellow]")


def describe_retries(retries: dict[str, int]) -> str:
    """The summary's line of retries per kind, over the whole run (resumes included)."""
    if not retries:
        return "retries: none"
    counted = ", ".join(f"{kind} x{count}" for kind, count in sorted(retries.items()))
    return f"retries: {sum(retries.values())} ({counted})"
