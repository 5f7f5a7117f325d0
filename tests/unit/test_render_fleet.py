"""Rendering a fleet's plan with its caches gives the output rendered node by node, uncached.

The caches (redaction and diffs per distinct text, redaction per shared change tuple, diff
markup per distinct diff, text printed once per node instead of once per line, a node's
body rendered once per distinct text and written again for its copies) change no
byte of text, markdown or JSON: shown on a generated 200-node fleet (bench/fleet.py) and on
hostile values, against a reference rendered the way it was before the caches.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from rollout.cli import render
from rollout.cli.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.facts import load_recorded_facts
from rollout.plan import FileChange, NodePlan, Plan, diff_file_texts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.secrets import parse_path, redact_change, redact_diff, redact_toml_pair
from rollout.spec.plan import parse_spec
from tests.examples import PLAN, REPO
from tests.script_modules import import_script


def generate_fleet(target: Path, count: int) -> None:
    import_script(REPO / "bench" / "fleet.py", "bench_fleet").generate_fleet(target, count)


def redact_node_by_node(plan: Plan) -> Plan:
    """The redaction as it was: every node's changes redacted again, nothing shared."""

    def node(n: NodePlan) -> NodePlan:
        effective = tuple(
            dataclasses.replace(c, before=shown[0], after=shown[1])
            for c in n.effective_changes
            for shown in [redact_change(parse_path(c.path), c.before, c.after)]
        )
        return dataclasses.replace(
            n,
            files=tuple(c.redacted() for c in n.files),
            effective_changes=effective,
            effective_diff=redact_diff(n.effective_diff),
        )

    waves = tuple(dataclasses.replace(w, nodes=tuple(node(n) for n in w.nodes)) for w in plan.waves)
    return dataclasses.replace(plan, waves=waves)


def print_line_by_line(self: render._Lines, console: Console, rendered: object = None) -> None:
    """Text as it was printed: one rich call per line, nothing kept as rendered."""
    for line in self.lines:
        console.print(line)
    self.lines.clear()


# values that could read differently printed at once than line by line (markup, escapes)
HOSTILE = (
    "gpu[/x]-1",
    "[conceal]hidden[/conceal]",
    "node\x1b[8mvanish",
    "[bold red]x[/]",
    ":warning:",
    "back\\",
    "\\[bold]",
    "two\\\\",
    "a|b`c</details>",
    "",
    " trailing ",
)


@contextmanager
def uncached() -> Iterator[None]:
    """Every render cache off: the reference path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("rollout.secrets.redact_toml_pair", redact_toml_pair.__wrapped__)
        patch.setattr("rollout.plan.redact_toml_pair", redact_toml_pair.__wrapped__)
        patch.setattr("rollout.plan.diff_file_texts", diff_file_texts.__wrapped__)
        patch.setattr("rollout.plan.redact_diff", redact_diff.__wrapped__)
        patch.setattr("rollout.cli.render.redact_plan", redact_node_by_node)
        patch.setattr(render, "_diff_markup", render._diff_markup.__wrapped__)
        patch.setattr(render._Lines, "flush_to", print_line_by_line)
        yield


def render_all(plan: Plan) -> tuple[str, str, str]:
    text = io.StringIO()
    print_plan_text(plan, make_console(text, False))
    colour = io.StringIO()
    print_plan_text(plan, make_console(colour, True))
    return plan_to_json(plan), plan_to_markdown(plan), text.getvalue() + colour.getvalue()


def test_a_200_node_fleet_renders_the_same_cached(tmp_path: Path) -> None:
    generate_fleet(tmp_path / "fleet", 200)
    fleet = load_recorded_facts(tmp_path / "fleet")
    plan = build_plan(parse_spec(PLAN.read_text(), str(PLAN)), str(PLAN), fleet, load_playbooks())
    assert len(plan.nodes) == 200
    with uncached():
        reference = render_all(plan)
    assert render_all(plan) == reference
    assert render_all(plan) == reference  # caches warm


def test_hostile_values_render_the_same_printed_at_once() -> None:
    fleet = load_recorded_facts(REPO / "examples" / "facts")
    plan = build_plan(parse_spec(PLAN.read_text(), str(PLAN)), str(PLAN), fleet, load_playbooks())
    nodes = []
    for index, value in enumerate(HOSTILE):
        node = plan.nodes[index % len(plan.nodes)]
        change = FileChange(f"/etc/{value}", f"a = 1\n{value}\n", f"b = '{value}'\n", value)
        nodes.append(
            dataclasses.replace(
                node, name=f"{value}-{index}", files=(*node.files, change), warnings=(value,)
            )
        )
    waves = (dataclasses.replace(plan.waves[0], nodes=tuple(nodes)),)
    hostile = dataclasses.replace(plan, waves=waves, warnings=tuple(HOSTILE))
    with uncached():
        reference = render_all(hostile)
    assert render_all(hostile) == reference
