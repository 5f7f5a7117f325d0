# long module: one job, a Plan for people and machines: text, markdown, JSON, run progress
"""Rendering for people and machines: plans as text (rich), markdown and JSON.

Part of the CLI layer, the only one that imports rich: everything else hands it plain data.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import io
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, TextIO

from rollout.capacity import describe_count, describe_node, fleet_lines
from rollout.cli.colors import color_wanted
from rollout.memo import BoundedCache
from rollout.plan import (
    CapacityForecast,
    ClusterChange,
    DriverChange,
    NodePlan,
    Plan,
    StepPlan,
    plan_to_data,
    redact_plan,
    to_data,
)
from rollout.plangroups import (
    NodeGroup,
    group_nodes,
    group_to_data,
    out_of_service,
    summarise,
    wave_loads,
)

# rich is imported where text is drawn: `-o json` never draws any (rich costs 45 ms to import)
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from rollout.executor import RunReport

# 2: `groups` (rollout.plangroups) and each node's `gpus` added; docs/plan-reference.md
SCHEMA_VERSION = 2
MAX_EFFECTIVE_LINES = 12
# C0 and C1 controls but tab and newline: an ESC in a node's file must not drive the terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def show_controls(text: str) -> str:
    """Control characters as `\\x1b`-style escapes, so they print instead of acting."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def safe(value: object) -> str:
    """A value from input or a node, ready for rich markup: brackets escaped, controls shown.

    Every value that is not rollout's own literal text goes through here: a legal value
    holding `[/x]` would otherwise crash the renderer, and `[conceal]` would hide text.
    """
    return _escape(show_controls(str(value)))


def _load_escape(text: str) -> str:
    """rich's markup escape, imported on the first call, which makes it `_escape` itself."""
    global _escape
    from rich.markup import escape

    _escape = escape
    return escape(text)


_escape: Callable[[str], str] = _load_escape


def make_console(stream: IO[str] | None = None, color: bool | None = None) -> Console:
    """A console that colours only a terminal (and not with NO_COLOR), unless told otherwise."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # the reader went away (`rollout plan | head`): main() ends quietly, as a Unix
            # tool killed by SIGPIPE does, instead of rich's exit 1 (a failure to a script)
            raise BrokenPipeError("the reader of rollout's output went away")

    color = color_wanted(color)
    return _Console(
        file=stream,
        no_color=color is False,
        # no_color drops colours only: bold and underline stay, so "never" sets no style at all
        color_system=None if color is False else "auto",
        force_terminal=True if color else None,
        highlight=False,
        # `:name:` in a value is text, not an emoji
        emoji=False,
        soft_wrap=True,
    )


def print_plan_text(plan: Plan, console: Console) -> None:
    """The plan as a reviewer reads it on a terminal."""
    plan, out = redact_plan(plan), _Lines()
    # copies of a node print the same body under their own names: rendered once each
    bodies: BoundedCache[str, str] = BoundedCache(64)
    total = len(plan.nodes)
    changing = sum(1 for n in plan.nodes if n.changes)
    out.print(
        f"[bold]Plan {safe(plan.name)}[/bold]: {safe(', '.join(plan.changes))} on {total} "
        f"node(s) in {len(plan.waves)} wave(s); facts from {safe(plan.facts_source)}"
    )
    out.print(
        f"  max unavailable {plan.max_unavailable}"
        + (
            f"; already unavailable: {safe(', '.join(plan.already_unavailable))}"
            if plan.already_unavailable
            else ""
        )
    )
    if plan.limit_note:
        out.print(f"  [bold]{safe(plan.limit_note)}[/bold]")
    for line in fleet_lines(plan.capacity, total):
        out.print(f"  {safe(line)}")
    for warning in plan.warnings:
        out.print(f"[yellow]warning:[/yellow] {safe(warning)}")
    print_cluster_changes(out, plan.cluster_changes)
    loads = wave_loads(plan)
    for wave in plan.waves:
        names = ", ".join(n.name for n in wave.nodes)
        out.print(f"\n[bold]Wave {wave.index}[/bold]: {safe(names)}")
        out.print(f"  {out_of_service(loads[wave.index])}")
        for node in wave.nodes:
            _print_node_header(out, node)
            out.flush_to(console)
            _print_node(out, node)
            out.flush_to(console, bodies)
    out.print()
    if plan.has_changes:
        files = sum(len(n.files) for n in plan.nodes)
        repaired = sum(1 for n in plan.nodes if n.repairs)
        out.print(
            f"[bold]Summary[/bold]: {changing} of {total} node(s) change, {files} file write(s)"
            + (f", {repaired} node(s) with shadowed config repaired" if repaired else "")
            + "."
        )
    else:
        out.print(
            "[bold green]No changes.[/bold green] Every targeted node already matches the plan."
        )
    out.flush_to(console)


def print_cluster_changes(out: _Lines, changes: Sequence[ClusterChange]) -> None:
    """The cluster-wide changes made before wave 1, each with its diff."""
    if not changes:
        return
    out.print("\n[bold]Before wave 1 (cluster-wide)[/bold]")
    for change in changes:
        if change.action is None:
            out.print(
                f"  = {safe(change.kind)} {safe(change.target)}: {safe(change.noop_reason or '')}"
            )
        else:
            out.print(
                f"  [cyan]~[/cyan] {safe(change.kind)} {safe(change.target)}: {safe(change.action)}"
            )
            _print_diff(out, change.diff, indent="      ")


class _Lines:
    """Markup lines printed together: rich's cost is per call, so one call per node."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str = "") -> None:
        self.lines.append(text)

    def flush_to(self, console: Console, rendered: BoundedCache[str, str] | None = None) -> None:
        """Print the lines; with `rendered`, lines printed before are written as rich wrote
        them then (rich renders markup at a per-character cost)."""
        if not self.lines:
            return
        text = "\n".join(self.lines)
        self.lines.clear()
        if rendered is None or console.is_jupyter or console.legacy_windows or console.record:
            console.print(text)
            return
        output = rendered.get(text)
        if output is None:
            # what console.print writes to its file on a POSIX or modern Windows console
            with console.capture() as capture:
                console.print(text)
            output = capture.get()
            rendered.put(text, output)
        console.file.write(output)
        console.file.flush()


def _print_node_header(out: _Lines, node: NodePlan) -> None:
    marker = "[cyan]~[/cyan]" if node.changes else "[green]=[/green]"
    state = " (cordoned or NotReady: counts against max unavailable)" if node.unavailable else ""
    out.print(
        f"\n  {marker} [bold]{safe(node.name)}[/bold]  "
        f"containerd {safe(node.containerd_version)}{state}"
    )


def _print_node(out: _Lines, node: NodePlan, diffs: DiffIndex | None = None) -> None:
    """A node's body; with `diffs`, a diff shown before is named instead of printed again."""
    if node.status:
        out.print(f"    [dim]{safe(node.status)}[/dim]")
    if node.driver is not None:
        out.print(f"    [bold]driver[/bold] {safe(describe_driver(node.driver))}")
    capacity = describe_node(node.capacity)
    if capacity is not None:
        out.print(f"    [bold]capacity[/bold] {safe(capacity)}")
    for text in node.shadowing:
        out.print(f"    [red]shadowed:[/red] {safe(text)}")
    for text in node.repairs:
        out.print(f"    [yellow]repair:[/yellow] {safe(text)}")
    for step in node.steps:
        kind = safe(f"{step.kind:<20}")
        if step.action is not None:
            out.print(f"    [cyan]{kind}[/cyan] {safe(step.action)}")
        else:
            out.print(f"    [dim]{kind} no-op: {safe(step.noop_reason or '')}[/dim]")
    for label in node.labels:
        out.print(
            f"    label {safe(label.key)}: {safe(repr(label.before))} -> {safe(repr(label.after))}"
        )
    for warning in node.warnings:
        out.print(f"    [yellow]warning:[/yellow] {safe(warning)}")
    for change in node.files:
        out.print(f"    [bold]{change.action} {safe(change.path)}[/bold]  ({safe(change.reason)})")
        diff = change.unified_diff()
        shown = diffs.first_shown(diff) if diffs is not None else None
        if shown is None:
            _print_diff(out, diff, indent="      ")
        else:
            out.print(f"      [dim](the same diff as {safe(shown)})[/dim]")
    if node.effective_changes:
        out.print(
            "    [bold]effective containerd config[/bold] (what containerd will load; "
            f"defaults from {safe(node.defaults_source or 'the files alone')}):"
        )
        for eff in node.effective_changes[:MAX_EFFECTIVE_LINES]:
            tag = "" if eff.intended else "  [yellow](repair)[/yellow]"
            out.print(
                f"      {safe(eff.path)}: {safe(_short(eff.before))} -> "
                f"{safe(_short(eff.after))}{tag}"
            )
        hidden = len(node.effective_changes) - MAX_EFFECTIVE_LINES
        if hidden > 0:
            out.print(f"      ... and {hidden} more (--output json or markdown shows all)")


class DiffIndex:
    """Where each distinct diff was first shown (`group 2`), so a fleet's output prints each
    distinct change once however many groups repeat it."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}
        self.where = ""

    def first_shown(self, diff: str) -> str | None:
        """Where `diff` was shown before, or None (and it is now shown at `where`)."""
        if not diff:
            return None
        first = self._first.get(diff)
        if first is None:
            self._first[diff] = self.where
        return first


def describe_driver(change: DriverChange) -> str:
    """`535.183.01 -> 550.127.05 (host mode), kernel 6.1.0-18-amd64, reboots: yes`."""
    return (
        f"{change.before} -> {change.after} ({change.mode} mode), "
        f"kernel {change.kernel or '(unknown)'}, reboots: {change.reboot or 'no'}"
    )


def _print_diff(out: _Lines, diff: str, indent: str) -> None:
    if diff:
        out.print(_diff_markup(diff, indent))


@functools.lru_cache(maxsize=1024)
def _diff_markup(diff: str, indent: str) -> str:
    """A diff's lines as markup, built once per distinct diff (copies of a node share theirs)."""
    out = []
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
        text = safe(line)
        out.append(f"{indent}[{style}]{text}[/{style}]" if style else f"{indent}{text}")
    return "\n".join(out)


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
    plan = redact_plan(plan)
    out: list[str] = []
    changing = [n for n in plan.nodes if n.changes]
    out.append(f"### rollout plan {md_code(plan.name)}\n")
    out.append(
        f"{md_text(', '.join(plan.changes))} on {len(plan.nodes)} node(s) in "
        f"{len(plan.waves)} wave(s); **{len(changing)}** node(s) change; "
        f"max unavailable {plan.max_unavailable}.\n"
    )
    if plan.limit_note:
        out.append(f"**{md_text(plan.limit_note)}**\n")
    out.extend(capacity_markdown(plan.capacity, len(plan.nodes)))
    for warning in plan.warnings:
        out.append(f"> **warning:** {md_text(warning)}\n")
    out.extend(cluster_changes_markdown(plan.cluster_changes))
    loads = wave_loads(plan)
    for wave in plan.waves:
        out.append(f"- wave {wave.index}: {out_of_service(loads[wave.index])}")
    out.append("")
    out.append("| wave | node | containerd | steps | files |")
    out.append("|---|---|---|---|---|")
    for wave in plan.waves:
        for node in wave.nodes:
            steps = " → ".join(s.kind for s in node.steps if s.changes) or "no-op"
            out.append(
                f"| {wave.index} | {md_text(node.name)} | {md_text(node.containerd_version)} "
                f"| {md_text(steps)} | {len(node.files)} |"
            )
    out.append("")
    drivers = [(w.index, n) for w in plan.waves for n in w.nodes if n.driver is not None]
    if drivers:
        out.append("| wave | node | driver | kernel | reboots |")
        out.append("|---|---|---|---|---|")
        for index, node in drivers:
            assert node.driver is not None
            moves = node.driver
            out.append(
                f"| {index} | {md_text(node.name)} | "
                f"{md_text(f'{moves.before} → {moves.after} ({moves.mode})')} | "
                f"{md_text(moves.kernel or '(unknown)')} | {md_text(moves.reboot or 'no')} |"
            )
        out.append("")
    for node in changing:
        out.append(f"<details><summary><b>{md_text(node.name)}</b></summary>\n")
        capacity = describe_node(node.capacity)
        if capacity is not None:
            out.append(f"- capacity {md_text(capacity)}")
        for text in node.shadowing:
            out.append(f"- :warning: shadowed: {md_text(text)}")
        for text in node.repairs:
            out.append(f"- repair: {md_text(text)}")
        for text in node.warnings:  # a code span: warnings quote paths and commands
            out.append(f"- :warning: {md_code(text)}")
        for write in node.files:
            out.append(f"\n{md_code(f'{write.action} {write.path}')} ({md_text(write.reason)})\n")
            out.append(md_fence(write.unified_diff(), "diff"))
        if node.effective_diff:
            source = node.defaults_source or "the files alone"
            out.append(f"\nEffective containerd config (defaults from {md_text(source)}):\n")
            out.append(md_fence(node.effective_diff, "diff"))
        out.append("\n</details>\n")
    return "\n".join(out) + "\n"


def capacity_markdown(forecast: CapacityForecast, nodes: int) -> list[str]:
    """The fleet's capacity forecast (rollout.capacity) as a markdown table and its notes."""
    heading = f"GPU capacity of the {nodes} target node(s), allocatable"
    out = [f"{heading}: {describe_count(None)}\n" if not forecast.resources else f"{heading}:\n"]
    if forecast.resources:
        out += ["| resource | before | after |", "|---|---|---|"]
    for resource in forecast.resources:
        out.append(
            f"| {md_code(resource.resource)} | {describe_count(resource.before)} "
            f"| {describe_count(resource.after)} |"
        )
    out.append("")
    out.extend(f"> note: {md_text(note)}\n" for note in forecast.notes)
    return out


def cluster_changes_markdown(changes: Sequence[ClusterChange]) -> list[str]:
    """The cluster-wide changes made before wave 1 as markdown lines, each with its diff."""
    if not changes:
        return []
    out = ["#### Cluster-wide, before wave 1\n"]
    for change in changes:
        out.append(
            f"- {md_code(f'{change.kind} {change.target}')}: "
            f"{md_text(change.action or change.noop_reason or '')}"
        )
        if change.diff:
            out.append("\n" + md_fence(change.diff, "diff"))
    out.append("")
    return out


def md_text(value: object) -> str:
    """A value as inline markdown text: no HTML, no table break, no line break, no controls."""
    text = show_controls(" ".join(str(value).splitlines()))
    text = re.sub(r"([\\`*_\[\]])", r"\\\1", text)
    return html.escape(text, quote=False).replace("|", "\\|")


def md_code(value: object) -> str:
    """A value as an inline code span, fenced by more backticks than it holds."""
    text = show_controls(" ".join(str(value).splitlines())).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_fence(text: str, language: str) -> str:
    """A block of text in a code fence no line of it can close."""
    body = show_controls(text).rstrip("\n")
    longest = max((len(run) for run in re.findall(r"^\s*(`{3,})", body, re.M)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{body}\n{fence}"


def plan_to_json(plan: Plan, forecast: Mapping[str, object] | None = None) -> str:
    """The plan as JSON, stable for machines: every dataclass field plus derived flags (and
    the duration forecast under "forecast", when given).

    File texts and effective values are redacted like every other output (rollout.secrets).
    """
    text = io.StringIO()
    write_plan_json(plan, text, forecast)
    return text.getvalue()


# Encoded pieces written at once: a fleet's JSON is written as it is encoded, never held whole
# (10,000 nodes make 170 MB of text). A piece is at most a node's text (17 KB in the examples).
JSON_PIECES_PER_WRITE = 64
_INDENT = "  "


def write_plan_json(
    plan: Plan, stream: TextIO, forecast: Mapping[str, object] | None = None
) -> None:
    """plan_to_json's text, written to `stream` as it is encoded.

    The text is `json.dumps(_plan_json_data(plan, forecast), indent=2, default=str)`'s,
    written node by node: copies of a node share their parts (the planner's memo), so each
    shared part is encoded once (_NodeJson) instead of once per node.
    """
    plan = redact_plan(plan)
    # the plan's fields as plan_to_data makes them, then what _plan_json_data adds as it is
    top = {
        f.name: None if f.name == "waves" else to_data(getattr(plan, f.name))
        for f in dataclasses.fields(plan)
    }
    top["schema_version"] = SCHEMA_VERSION
    top["has_changes"] = plan.has_changes
    groups = group_nodes(plan)
    top["groups"] = [group_to_data(g) for g in groups]
    top["out_of_service"] = out_of_service_data(plan, groups)
    if forecast is not None:
        top["forecast"] = dict(forecast)
    nodes = _NodeJson()
    pieces: list[str] = ["{"]
    for index, (key, value) in enumerate(top.items()):
        pieces.append(("," if index else "") + "\n" + _INDENT + json_text(key, 1) + ": ")
        if key != "waves" or not plan.waves:
            pieces.append(json_text([] if key == "waves" else value, 1))
            continue
        pieces.append("[")
        for wave_index, wave in enumerate(plan.waves):
            pieces.append(("," if wave_index else "") + "\n" + _INDENT * 2)
            for field_index, f in enumerate(dataclasses.fields(wave)):
                field = getattr(wave, f.name)
                name = (
                    ("{" if field_index == 0 else ",") + "\n" + _INDENT * 3 + json_text(f.name, 3)
                )
                if f.name != "nodes" or not field:
                    pieces.append(name + ": " + json_text(to_data(field), 3))
                    continue
                pieces.append(name + ": [")
                for node_index, node in enumerate(field):
                    pieces.append(("," if node_index else "") + "\n" + _INDENT * 4)
                    pieces.append(nodes.text(node, 4))
                    if len(pieces) >= JSON_PIECES_PER_WRITE:
                        stream.write("".join(pieces))
                        pieces.clear()
                pieces.append("\n" + _INDENT * 3 + "]")
            pieces.append("\n" + _INDENT * 2 + "}")
        pieces.append("\n" + _INDENT + "]")
    pieces.append("\n}\n")
    stream.write("".join(pieces))


class _NodeJson:
    """A node's JSON text in write_plan_json: its shared parts encoded once per write.

    The containerd parts (files, effective changes, shadowing, repairs) are the planner's
    memo's tuples, shared by every copy of a node: encoded once per object (kept alive here,
    so no id is reused while the text is). Steps are fresh per node but repeat by value;
    StepPlan's fields are strings, so equal steps are the same text.
    """

    SHARED = ("files", "effective_changes", "shadowing", "repairs")

    def __init__(self) -> None:
        self._by_id: dict[tuple[str, int, int], tuple[object, str]] = {}
        self._steps: dict[tuple[int, tuple[StepPlan, ...]], str] = {}
        # the other fields but the name, by value: copies repeat their version, effective
        # diff (the memo's one string), status, warnings, labels and driver
        self._values: dict[tuple[str, int, object], str] = {}
        self._fields: dict[type[NodePlan], tuple[tuple[str, str], ...]] = {}

    def text(self, node: NodePlan, level: int) -> str:
        inner = "\n" + _INDENT * (level + 1)
        pieces = ["{"]
        names = self._fields.get(type(node))
        if names is None:
            names = self._fields[type(node)] = tuple(
                (f.name, json_text(f.name, 0)) for f in dataclasses.fields(node)
            )
        for index, (name, key) in enumerate(names):
            value = getattr(node, name)
            if name in self.SHARED:
                shown = self._shared(name, value, level + 1)
            elif name == "steps":
                shown = self._steps_text(value, level + 1)
            elif name == "name":
                shown = json_text(to_data(value), level + 1)
            else:
                shown = self._value_text(name, value, level + 1)
            pieces.append(("," if index else "") + inner + key + ": " + shown)
        pieces.append("," + inner + '"changes": ' + json_text(node.changes, 0))
        pieces.append("\n" + _INDENT * level + "}")
        return "".join(pieces)

    def _shared(self, name: str, value: tuple[Any, ...], level: int) -> str:
        key = (name, id(value), level)
        hit = self._by_id.get(key)
        if hit is None or hit[0] is not value:
            data = to_data(value)
            if name == "files":
                for file_data, change in zip(data, value, strict=True):
                    file_data["action"] = change.action
                    file_data["diff"] = change.unified_diff()
            hit = self._by_id[key] = (value, json_text(data, level))
        return hit[1]

    def _value_text(self, name: str, value: object, level: int) -> str:
        key = (name, level, value)
        try:
            text = self._values.get(key)
        except TypeError:  # not hashable: encoded every time
            return json_text(to_data(value), level)
        if text is None:
            text = self._values[key] = json_text(to_data(value), level)
        return text

    def _steps_text(self, steps: tuple[StepPlan, ...], level: int) -> str:
        key = (level, steps)
        text = self._steps.get(key)
        if text is None:
            text = self._steps[key] = json_text(to_data(steps), level)
        return text


def json_text(value: Any, level: int) -> str:
    """`json.dumps(value, indent=2, default=str)` of plain data, as if nested `level` deep."""
    pieces: list[str] = []
    _append_json(value, level, pieces)
    return "".join(pieces)


def _append_json(value: Any, level: int, out: list[str]) -> None:
    # the json module's own order of checks (json.encoder._make_iterencode), so that a bool
    # is never taken for an int nor a str subclass for anything but a str
    if isinstance(value, str):
        out.append(json.encoder.encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float_text(value))
    elif isinstance(value, list | tuple):
        if not value:
            out.append("[]")
            return
        inner = "\n" + _INDENT * (level + 1)
        for index, item in enumerate(value):
            out.append(("[" if index == 0 else ",") + inner)
            _append_json(item, level + 1, out)
        out.append("\n" + _INDENT * level + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = "\n" + _INDENT * (level + 1)
        for index, (key, item) in enumerate(value.items()):
            out.append(("{" if index == 0 else ",") + inner + _key_text(key) + ": ")
            _append_json(item, level + 1, out)
        out.append("\n" + _INDENT * level + "}")
    else:  # default=str
        _append_json(str(value), level, out)


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == float("-inf"):
        return "-Infinity"
    return float.__repr__(value)


def _key_text(key: object) -> str:
    if isinstance(key, str):
        text = key
    elif isinstance(key, float):
        text = _float_text(key)
    elif key is True or key is False or key is None:
        text = json.dumps(key)
    elif isinstance(key, int):
        text = int.__repr__(key)
    else:
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
    return json.encoder.encode_basestring_ascii(text)


def _plan_json_data(plan: Plan, forecast: Mapping[str, object] | None) -> dict[str, Any]:
    plan = redact_plan(plan)
    data = plan_to_data(plan)
    data["schema_version"] = SCHEMA_VERSION
    data["has_changes"] = plan.has_changes
    groups = group_nodes(plan)
    data["groups"] = [group_to_data(g) for g in groups]
    data["out_of_service"] = out_of_service_data(plan, groups)
    for node_data, node in zip(
        (n for w in data["waves"] for n in w["nodes"]), plan.nodes, strict=True
    ):
        node_data["changes"] = node.changes
        for file_data, change in zip(node_data["files"], node.files, strict=True):
            file_data["action"] = change.action
            file_data["diff"] = change.unified_diff()
    if forecast is not None:
        data["forecast"] = dict(forecast)
    return data


def out_of_service_data(plan: Plan, groups: Sequence[NodeGroup]) -> list[dict[str, int]]:
    """What each wave takes out of service (the summary's wave lines), as JSON lists it."""
    return [
        {
            "wave": load.index,
            "nodes": load.taken_down,
            "gpus": load.gpus,
            "gpus_at_once": load.gpus_at_once,
        }
        for load in summarise(plan, groups).waves
    ]


def print_forecast(lines: list[str], console: Console) -> None:
    """The duration forecast (rollout/schedule/forecast.py) after the plan's summary."""
    console.print("\n".join(safe(line) for line in lines), highlight=False)


def forecast_to_markdown(lines: list[str]) -> str:
    """The duration forecast as a section of the review comment."""
    return "\n#### Forecast\n\n" + md_fence("\n".join(lines), "text") + "\n"


class ProgressLines:
    """Executor progress as plain timestamped lines: for logs, CI and pipes."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._started: dict[str, float] = {}

    def _line(self, text: str) -> None:
        self._console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {safe(text)}")

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
        self._console.print(f"[bold red]halted:[/bold red] {safe(reason)}")


def print_run_summary(
    console: Console, run_id: str, outcome: str, reason: str, nodes: Mapping[str, tuple[str, str]]
) -> None:
    """The final table of a run: each node's outcome and why."""
    from rich.table import Table

    table = Table(title=f"run {safe(run_id)}: {safe(outcome)}", title_justify="left")
    table.add_column("node")
    table.add_column("outcome")
    table.add_column("reason", overflow="fold")
    for node, (node_outcome, node_reason) in nodes.items():
        style = {"succeeded": "green", "pending": "dim"}.get(node_outcome, "red")
        table.add_row(safe(node), f"[{style}]{safe(node_outcome)}[/{style}]", safe(node_reason))
    console.print(table)
    if reason:
        console.print(f"halted: {safe(reason)}")


@dataclass
class _NodeRow:
    wave: int
    state: str = "pending"
    step: str = ""
    started: float | None = None
    finished: float | None = None


class LiveProgress:
    """Executor progress as a live table on a terminal: wave, node, state, step, elapsed."""

    # More nodes than this: the table lists the nodes at work or in trouble, and counts the rest.
    MAX_ROWS = 20

    def __init__(self, console: Console, waves: Mapping[str, int]) -> None:
        self._rows = {node: _NodeRow(wave) for node, wave in waves.items()}
        self._halt = ""
        # Drawn 4 times a second from the current rows, not once per event: a wave of many
        # nodes in parallel sends many events, and each redraw costs a row per node.
        from rich.live import Live

        self._live = Live(
            console=console, refresh_per_second=4, transient=False, get_renderable=self.table
        )

    def __enter__(self) -> LiveProgress:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()  # draws the rows once more, as they end

    def table(self) -> Table:
        from rich.table import Table

        now = time.monotonic()
        table = Table(title="rollout apply", title_justify="left")
        for column in ("wave", "node", "state", "step", "elapsed"):
            table.add_column(column)
        rows = list(self._rows.items())  # the executor's threads update rows meanwhile
        shown = rows
        if len(rows) > self.MAX_ROWS:
            shown = [(n, r) for n, r in rows if r.state not in ("pending", "succeeded")]
            states = [r.state for _, r in rows]
            table.caption = (
                f"{states.count('succeeded')} succeeded, {states.count('pending')} pending, "
                f"{len(shown)} shown of {len(rows)} nodes"
            )
        for node, row in shown:
            elapsed = ""
            if row.started is not None:
                elapsed = f"{(row.finished or now) - row.started:.0f}s"
            style = {"succeeded": "green", "running": "cyan", "pending": "dim"}.get(
                row.state, "red"
            )
            table.add_row(
                str(row.wave),
                safe(node),
                f"[{style}]{safe(row.state)}[/{style}]",
                safe(row.step),
                elapsed,
            )
        if self._halt:
            table.caption = f"halted: {safe(self._halt)}" + (
                f"; {table.caption}" if table.caption else ""
            )
        return table

    def node_started(self, wave: int, node: str) -> None:
        row = self._rows.setdefault(node, _NodeRow(wave))
        row.state, row.started = "running", time.monotonic()

    def step_started(self, node: str, step: str) -> None:
        self._rows[node].step = step

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None:
        self._rows[node].step = f"{step}: {outcome}"

    def node_finished(self, node: str, outcome: str, reason: str) -> None:
        row = self._rows[node]
        row.state, row.finished = outcome, time.monotonic()
        row.step = reason[:80] if reason else ""

    def halted(self, reason: str) -> None:
        self._halt = reason


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
