"""Rendering for people and machines: plans as text (rich), markdown and JSON.

Part of the CLI layer, the only one that imports rich: everything else hands it plain data.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from rollout.executor import RunReport
from rollout.plan import NodePlan, Plan, plan_to_data

SCHEMA_VERSION = 1
MAX_EFFECTIVE_LINES = 12


def make_console(stream: IO[str] | None = None, color: bool | None = None) -> Console:
    """A console that colours only a terminal, unless told otherwise."""
    return Console(
        file=stream,
        no_color=color is False,
        force_terminal=True if color else None,
        highlight=False,
        soft_wrap=True,
    )


def print_plan_text(plan: Plan, console: Console) -> None:
    """The plan as a reviewer reads it on a terminal."""
    total = len(plan.nodes)
    changing = sum(1 for n in plan.nodes if n.changes)
    console.print(
        f"[bold]Plan {escape(plan.name)}[/bold]: {', '.join(plan.changes)} on {total} node(s) "
        f"in {len(plan.waves)} wave(s); facts from {escape(plan.facts_source)}"
    )
    console.print(
        f"  max unavailable {plan.max_unavailable}"
        + (
            f"; already unavailable: {', '.join(plan.already_unavailable)}"
            if plan.already_unavailable
            else ""
        )
    )
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if plan.cluster_changes:
        console.print("\n[bold]Before wave 1 (cluster-wide)[/bold]")
        for change in plan.cluster_changes:
            if change.action is None:
                console.print(
                    f"  = {change.kind} {change.target}: {escape(change.noop_reason or '')}"
                )
            else:
                console.print(
                    f"  [cyan]~[/cyan] {change.kind} {change.target}: {escape(change.action)}"
                )
                _print_diff(console, change.diff, indent="      ")
    for wave in plan.waves:
        console.print(f"\n[bold]Wave {wave.index}[/bold]: {', '.join(n.name for n in wave.nodes)}")
        for node in wave.nodes:
            _print_node(console, node)
    console.print()
    if plan.has_changes:
        files = sum(len(n.files) for n in plan.nodes)
        repaired = sum(1 for n in plan.nodes if n.repairs)
        console.print(
            f"[bold]Summary[/bold]: {changing} of {total} node(s) change, {files} file write(s)"
            + (f", {repaired} node(s) with shadowed config repaired" if repaired else "")
            + "."
        )
    else:
        console.print(
            "[bold green]No changes.[/bold green] Every targeted node already matches the plan."
        )


def _print_node(console: Console, node: NodePlan) -> None:
    marker = "[cyan]~[/cyan]" if node.changes else "[green]=[/green]"
    state = " (cordoned or NotReady: counts against max unavailable)" if node.unavailable else ""
    console.print(
        f"\n  {marker} [bold]{node.name}[/bold]  containerd {node.containerd_version}{state}"
    )
    if node.status:
        console.print(f"    [dim]{escape(node.status)}[/dim]")
    for text in node.shadowing:
        console.print(f"    [red]shadowed:[/red] {escape(text)}")
    for text in node.repairs:
        console.print(f"    [yellow]repair:[/yellow] {escape(text)}")
    for step in node.steps:
        if step.action is not None:
            console.print(f"    [cyan]{step.kind:<20}[/cyan] {escape(step.action)}")
        else:
            console.print(f"    [dim]{step.kind:<20} no-op: {escape(step.noop_reason or '')}[/dim]")
    for label in node.labels:
        console.print(f"    label {label.key}: {label.before!r} -> {label.after!r}")
    for warning in node.warnings:
        console.print(f"    [yellow]warning:[/yellow] {escape(warning)}")
    for change in node.files:
        console.print(f"    [bold]{change.action} {change.path}[/bold]  ({escape(change.reason)})")
        _print_diff(console, change.unified_diff(), indent="      ")
    if node.effective_changes:
        console.print(
            "    [bold]effective containerd config[/bold] (what containerd will load; "
            f"defaults from {escape(node.defaults_source or 'the files alone')}):"
        )
        for eff in node.effective_changes[:MAX_EFFECTIVE_LINES]:
            tag = "" if eff.intended else "  [yellow](repair)[/yellow]"
            console.print(
                f"      {escape(eff.path)}: {_short(eff.before)} -> {_short(eff.after)}{tag}"
            )
        hidden = len(node.effective_changes) - MAX_EFFECTIVE_LINES
        if hidden > 0:
            console.print(f"      ... and {hidden} more (--output json or markdown shows all)")


def _print_diff(console: Console, diff: str, indent: str) -> None:
    for line in diff.splitlines():
        style = (
            "bold"
            if line.startswith(("+++", "---"))
            else "green"
            if line.startswith("+")
            else "red"
            if line.startswith("-")
            else "cyan"
            if line.startswith("@@")
            else None
        )
        text = escape(line)
        console.print(f"{indent}[{style}]{text}[/{style}]" if style else f"{indent}{text}")


def _short(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, dict):
        return f"{{table of {_count_leaves(value)} setting(s)}}"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _count_leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_count_leaves(v) for v in value.values()) or 1
    return 1


def plan_to_markdown(plan: Plan) -> str:
    """The plan as a code-review comment."""
    out: list[str] = []
    changing = [n for n in plan.nodes if n.changes]
    out.append(f"### rollout plan `{plan.name}`\n")
    out.append(
        f"{', '.join(plan.changes)} on {len(plan.nodes)} node(s) in {len(plan.waves)} wave(s); "
        f"**{len(changing)}** node(s) change; max unavailable {plan.max_unavailable}.\n"
    )
    for warning in plan.warnings:
        out.append(f"> **warning:** {warning}\n")
    if plan.cluster_changes:
        out.append("#### Cluster-wide, before wave 1\n")
        for change in plan.cluster_changes:
            out.append(f"- `{change.kind} {change.target}`: {change.action or change.noop_reason}")
            if change.diff:
                out.append(f"\n```diff\n{change.diff}```")
        out.append("")
    out.append("| wave | node | containerd | steps | files |")
    out.append("|---|---|---|---|---|")
    for wave in plan.waves:
        for node in wave.nodes:
            steps = " → ".join(s.kind for s in node.steps if s.changes) or "no-op"
            out.append(
                f"| {wave.index} | {node.name} | {node.containerd_version} | {steps} "
                f"| {len(node.files)} |"
            )
    out.append("")
    for node in changing:
        out.append(f"<details><summary><b>{node.name}</b></summary>\n")
        for text in node.shadowing:
            out.append(f"- :warning: shadowed: {text}")
        for text in node.repairs:
            out.append(f"- repair: {text}")
        for write in node.files:
            out.append(f"\n`{write.action} {write.path}` ({write.reason})\n")
            out.append(f"```diff\n{write.unified_diff()}```")
        if node.effective_diff:
            source = node.defaults_source or "the files alone"
            out.append(f"\nEffective containerd config (defaults from {source}):\n")
            out.append(f"```diff\n{node.effective_diff.rstrip()}\n```")
        out.append("\n</details>\n")
    return "\n".join(out) + "\n"


def plan_to_json(plan: Plan) -> str:
    """The plan as JSON, stable for machines: every dataclass field plus derived flags."""
    data = plan_to_data(plan)
    data["schema_version"] = SCHEMA_VERSION
    data["has_changes"] = plan.has_changes
    for node_data, node in zip(
        (n for w in data["waves"] for n in w["nodes"]), plan.nodes, strict=True
    ):
        node_data["changes"] = node.changes
        for file_data, change in zip(node_data["files"], node.files, strict=True):
            file_data["action"] = change.action
            file_data["diff"] = change.unified_diff()
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"


class ProgressLines:
    """Executor progress as plain timestamped lines: for logs, CI and pipes."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._started: dict[str, float] = {}

    def _line(self, text: str) -> None:
        self._console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {escape(text)}")

    def node_started(self, wave: int, node: str) -> None:
        self._started[node] = time.monotonic()
        self._line(f"wave {wave}: {node} starts")

    def step_started(self, node: str, step: str) -> None:
        self._line(f"{node}: {step} ...")

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None:
        tail = f": {detail}" if detail else ""
        self._line(f"{node}: {step} {outcome}{tail}")

    def node_finished(self, node: str, outcome: str, reason: str) -> None:
        took = time.monotonic() - self._started.get(node, time.monotonic())
        tail = f": {reason}" if reason else ""
        self._line(f"{node}: {outcome} after {took:.0f}s{tail}")

    def halted(self, reason: str) -> None:
        self._console.print(f"[bold red]halted:[/bold red] {escape(reason)}")


def print_run_summary(
    console: Console, run_id: str, outcome: str, reason: str, nodes: Mapping[str, tuple[str, str]]
) -> None:
    """The final table of a run: each node's outcome and why."""
    table = Table(title=f"run {run_id}: {outcome}", title_justify="left")
    table.add_column("node")
    table.add_column("outcome")
    table.add_column("reason", overflow="fold")
    for node, (node_outcome, node_reason) in nodes.items():
        style = {"succeeded": "green", "pending": "dim"}.get(node_outcome, "red")
        table.add_row(node, f"[{style}]{node_outcome}[/{style}]", escape(node_reason))
    console.print(table)
    if reason:
        console.print(f"halted: {escape(reason)}")


@dataclass
class _NodeRow:
    wave: int
    state: str = "pending"
    step: str = ""
    started: float | None = None
    finished: float | None = None


class LiveProgress:
    """Executor progress as a live table on a terminal: wave, node, state, step, elapsed."""

    def __init__(self, console: Console, waves: Mapping[str, int]) -> None:
        self._rows = {node: _NodeRow(wave) for node, wave in waves.items()}
        self._halt = ""
        self._live = Live(self.table(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self.table())
        self._live.stop()

    def table(self) -> Table:
        now = time.monotonic()
        table = Table(title="rollout apply", title_justify="left")
        for column in ("wave", "node", "state", "step", "elapsed"):
            table.add_column(column)
        for node, row in self._rows.items():
            elapsed = ""
            if row.started is not None:
                elapsed = f"{(row.finished or now) - row.started:.0f}s"
            style = {"succeeded": "green", "running": "cyan", "pending": "dim"}.get(
                row.state, "red"
            )
            table.add_row(
                str(row.wave), node, f"[{style}]{row.state}[/{style}]", escape(row.step), elapsed
            )
        if self._halt:
            table.caption = f"halted: {escape(self._halt)}"
        return table

    def _refresh(self) -> None:
        self._live.update(self.table())

    def node_started(self, wave: int, node: str) -> None:
        row = self._rows.setdefault(node, _NodeRow(wave))
        row.state, row.started = "running", time.monotonic()
        self._refresh()

    def step_started(self, node: str, step: str) -> None:
        self._rows[node].step = step
        self._refresh()

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None:
        self._rows[node].step = f"{step}: {outcome}"
        self._refresh()

    def node_finished(self, node: str, outcome: str, reason: str) -> None:
        row = self._rows[node]
        row.state, row.finished = outcome, time.monotonic()
        row.step = reason[:80] if reason else ""
        self._refresh()

    def halted(self, reason: str) -> None:
        self._halt = reason
        self._refresh()


def report_to_json(run_id: str, report: RunReport) -> str:
    """A run's outcome for tools: run id, outcome, halt reason, each node's outcome and reason."""
    nodes = {
        name: {"outcome": outcome, "reason": reason}
        for name, (outcome, reason) in report.nodes.items()
    }
    doc = {
        "run_id": run_id,
        "outcome": report.outcome.value,
        "halt_reason": report.halt_reason or None,
        "nodes": nodes,
    }
    return json.dumps(doc, indent=2) + "\n"
