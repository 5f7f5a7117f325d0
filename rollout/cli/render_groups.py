"""A plan as a reviewer reads a fleet's: a summary, then each group of nodes planned alike once.

Text and markdown print each group (rollout.plangroups) once, with its node count, its names
compressed and its diffs; a diff another group showed before is named, not printed again.
Order: refusals and nodes already broken, warnings, changes, then the no-op nodes as counts.
`--full` prints every node (render.print_plan_text, render.plan_to_markdown).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rollout.capacity import describe_node, fleet_lines
from rollout.cli.render import (
    DiffIndex,
    _Lines,
    _print_node,
    capacity_markdown,
    cluster_changes_markdown,
    describe_driver,
    md_code,
    md_fence,
    md_text,
    plan_to_markdown,
    print_cluster_changes,
    print_plan_text,
    safe,
)
from rollout.plan import NodePlan, Plan, redact_plan
from rollout.plangroups import (
    GroupKind,
    NodeGroup,
    PlanSummary,
    describe_names,
    describe_wave,
    group_nodes,
    summarise,
)

if TYPE_CHECKING:
    from rich.console import Console

# a group of plain changes lists this many characters of names, then "and N more"; a group
# a reviewer must see (refused, broken, warnings) lists every node
NAMES_SHOWN = 240
# waves listed in the summary (consecutive waves alike are one line); the rest are counted
WAVE_LINES = 30

_TITLES = {
    GroupKind.REFUSED: "refused",
    GroupKind.BROKEN: "already broken",
    GroupKind.WARNING: "with warnings",
    GroupKind.CHANGE: "changes",
    GroupKind.NOOP: "no-op",
}


def print_plan(plan: Plan, console: Console, full: bool = False) -> None:
    """The plan on a terminal: grouped, or every node with `full`."""
    if full:
        print_plan_text(plan, console)
        return
    plan, out = redact_plan(plan), _Lines()
    groups = group_nodes(plan)
    summary = summarise(plan, groups)
    out.print(
        f"[bold]Plan {safe(plan.name)}[/bold]: {safe(', '.join(plan.changes))} on "
        f"{summary.nodes} node(s) in {len(plan.waves)} wave(s) x {summary.groups} group(s); "
        f"facts from {safe(plan.facts_source)}"
    )
    if plan.limit_note:
        out.print(f"  [bold]{safe(plan.limit_note)}[/bold]")
    for line in [*summary_lines(plan, summary), *fleet_lines(plan.capacity, summary.nodes)]:
        out.print(f"  {safe(line)}")
    for warning in plan.warnings:
        out.print(f"[yellow]warning:[/yellow] {safe(warning)}")
    print_cluster_changes(out, plan.cluster_changes)
    diffs = DiffIndex()
    for group in groups:
        if group.kind is GroupKind.NOOP:
            continue
        diffs.where = f"group {group.number}"
        out.print(f"\n{_group_heading(group, '[bold]', '[/bold]', safe)}")
        out.print(f"    [bold]nodes:[/bold] {safe(_names(group))}")
        _print_node(out, group.node, diffs)
        out.flush_to(console)
    no_ops = [g for g in groups if g.kind is GroupKind.NOOP]
    if no_ops:
        out.print()
    for group in no_ops:
        out.print(f"[green]=[/green] {safe(_no_op_line(group))}")
    out.print()
    if not plan.has_changes:
        out.print(
            "[bold green]No changes.[/bold green] Every targeted node already matches the plan."
        )
    out.flush_to(console)


def summary_lines(plan: Plan, summary: PlanSummary) -> list[str]:
    """The summary as plain lines: nodes changing, untouched and why, each wave's load."""
    untouched = sum(count for _, count in summary.untouched)
    why = "; ".join(f"{count} {reason}" for reason, count in summary.untouched)
    lines = [
        f"{summary.changing} of {summary.nodes} node(s) change; {untouched} node(s) untouched"
        + (f" ({why})" if why else ""),
        f"max unavailable {plan.max_unavailable}"
        + (
            f"; already unavailable: {', '.join(plan.already_unavailable)}"
            if plan.already_unavailable
            else ""
        ),
    ]
    return lines + wave_lines(summary)


def wave_lines(summary: PlanSummary) -> list[str]:
    """One line per wave, consecutive waves alike as one (`waves 2-9: each ...`), at most
    WAVE_LINES of them."""
    runs: list[tuple[int, int, str]] = []
    for load in summary.waves:
        text = describe_wave(load).split(": ", 1)[1]
        if runs and runs[-1][2] == text and runs[-1][1] == load.index - 1:
            runs[-1] = (runs[-1][0], load.index, text)
        else:
            runs.append((load.index, load.index, text))
    lines = [
        f"wave {first}: {text}" if first == last else f"waves {first}-{last}: each {text}"
        for first, last, text in runs[:WAVE_LINES]
    ]
    if len(runs) > WAVE_LINES:
        left = sum(last - first + 1 for first, last, _ in runs[WAVE_LINES:])
        lines.append(f"... and {left} more wave(s) (--full lists every node by wave)")
    return lines


def _group_heading(
    group: NodeGroup, bold: str, unbold: str, escape: Callable[[object], str]
) -> str:
    node = group.node
    state = " (cordoned or NotReady: counts against max unavailable)" if node.unavailable else ""
    waves = ", ".join(str(index) for index, _ in group.waves)
    return (
        f"{bold}Group {group.number}{unbold} ({_TITLES[group.kind]}): {group.size} node(s), "
        f"containerd {escape(node.containerd_version)}, wave(s) {waves}{state}"
    )


def _names(group: NodeGroup) -> str:
    every = group.kind in (GroupKind.REFUSED, GroupKind.BROKEN, GroupKind.WARNING)
    return describe_names(group.names, None if every else NAMES_SHOWN)


def _no_op_line(group: NodeGroup) -> str:
    return (
        f"{group.size} node(s) already match the plan (group {group.number}, containerd "
        f"{group.node.containerd_version}): {no_op_reason(group.node)}; {_names(group)}"
    )


def no_op_reason(node: NodePlan) -> str:
    """Why a node with nothing to do is left alone: its steps' distinct no-op reasons."""
    reasons = dict.fromkeys(s.noop_reason for s in node.steps if s.noop_reason)
    return "; ".join(r for r in reasons if r) or "nothing to do"


def plan_markdown(plan: Plan, full: bool = False) -> str:
    """The plan as a code-review comment: grouped, or every node with `full`."""
    if full:
        return plan_to_markdown(plan)
    plan = redact_plan(plan)
    groups = group_nodes(plan)
    summary = summarise(plan, groups)
    out = [
        f"### rollout plan {md_code(plan.name)}\n",
        f"{md_text(', '.join(plan.changes))} on {summary.nodes} node(s) in "
        f"{len(plan.waves)} wave(s) x {summary.groups} group(s); **{summary.changing}** "
        "node(s) change.\n",
    ]
    if plan.limit_note:
        out.append(f"**{md_text(plan.limit_note)}**\n")
    out.extend(f"- {md_text(line)}" for line in summary_lines(plan, summary))
    out.append("")
    out.extend(capacity_markdown(plan.capacity, summary.nodes))
    for warning in plan.warnings:
        out.append(f"> **warning:** {md_text(warning)}\n")
    out.extend(cluster_changes_markdown(plan.cluster_changes))
    diffs = DiffIndex()
    for group in groups:
        if group.kind is not GroupKind.NOOP:
            diffs.where = f"group {group.number}"
            out.extend(_group_markdown(group, diffs))
    no_ops = [g for g in groups if g.kind is GroupKind.NOOP]
    if no_ops:
        out.append("#### No-op\n")
        out.extend(f"- {md_text(_no_op_line(g))}" for g in no_ops)
        out.append("")
    return "\n".join(out) + "\n"


def _group_markdown(group: NodeGroup, diffs: DiffIndex) -> list[str]:
    node = group.node
    out = [f"#### {_group_heading(group, '', '', md_text)}\n"]
    out.append(f"Nodes: {md_text(_names(group))}\n")
    if node.driver is not None:
        out.append(f"- driver {md_text(describe_driver(node.driver))}")
    capacity = describe_node(node.capacity)
    if capacity is not None:
        out.append(f"- capacity {md_text(capacity)}")
    for text in node.shadowing:
        out.append(f"- :warning: shadowed: {md_text(text)}")
    for text in node.repairs:
        out.append(f"- repair: {md_text(text)}")
    for text in node.warnings:  # a code span: warnings quote paths and commands
        out.append(f"- :warning: {md_code(text)}")
    steps = " → ".join(s.kind for s in node.steps if s.changes) or "no-op"
    out.append(f"- steps: {md_text(steps)}")
    for label in node.labels:
        out.append(
            f"- label {md_code(label.key)}: {md_text(f'{label.before!r} -> {label.after!r}')}"
        )
    for write in node.files:
        out.append(f"\n{md_code(f'{write.action} {write.path}')} ({md_text(write.reason)})\n")
        diff = write.unified_diff()
        shown = diffs.first_shown(diff)
        out.append(md_fence(diff, "diff") if shown is None else f"(the same diff as {shown})")
    if node.effective_diff:
        source = node.defaults_source or "the files alone"
        out.append(f"\nEffective containerd config (defaults from {md_text(source)}):\n")
        shown = diffs.first_shown(node.effective_diff)
        out.append(
            md_fence(node.effective_diff, "diff") if shown is None else f"(the same as {shown})"
        )
    out.append("")
    return out
