"""Hostile values from input and nodes print as text in every output format (invariant 9's
neighbour: what a reviewer sees before `apply` asks is what is there)."""

from __future__ import annotations

import io
import json
import re

import pytest

from rollout.cli.render import (
    LiveProgress,
    ProgressLines,
    make_console,
    md_code,
    md_fence,
    plan_to_json,
    plan_to_markdown,
    print_plan_text,
    print_run_summary,
    safe,
)
from rollout.plan import (
    ClusterChange,
    EffectiveChange,
    FileChange,
    LabelChange,
    NodePlan,
    Plan,
    StepPlan,
    Wave,
)

CLOSE = "gpu[/x]-1"  # a closing tag with nothing open: rich raises MarkupError
CONCEAL = "[conceal]hidden-text[/conceal]"  # hides text on a colour terminal
ESC = "node\x1b[8mvanish"  # the terminal's own conceal, straight from a file
HOSTILE = (CLOSE, CONCEAL, ESC, "[bold red]x[/]", ":warning:", "back\\", "a|b`c</details>")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def hostile_plan(value: str) -> Plan:
    node = NodePlan(
        name=value,
        containerd_version=value,
        status=value,
        steps=(
            StepPlan(kind="containerd.write", why="", action=f"write {value}"),
            StepPlan(kind=value, why="", noop_reason=value),
        ),
        files=(
            FileChange(
                path=f"/etc/containerd/{value}.toml",
                before=f'a = "{value}"\n',
                after=f'a = "{value}!"\n# {value}\n',
                reason=value,
            ),
        ),
        effective_changes=(
            EffectiveChange(path=f'"{value}".x', before=value, after=1, intended=True),
        ),
        effective_diff=(
            f'--- effective before\n+++ effective after\n@@ -1 +1 @@\n-x = 1\n+x = "{value}"\n'
        ),
        defaults_source=value,
        shadowing=(value,),
        repairs=(value,),
        labels=(LabelChange(key=value, before=value, after=None),),
        warnings=(value,),
    )
    return Plan(
        name=value,
        source=value,
        facts_source=value,
        changes=(value,),
        waves=(Wave(index=1, nodes=(node,)),),
        cluster_changes=(
            ClusterChange(kind=value, target=value, action=value, diff=f"+{value}\n"),
        ),
        already_unavailable=(value,),
        warnings=(value,),
    )


def text_of(value: str, color: bool) -> str:
    out = io.StringIO()
    print_plan_text(hostile_plan(value), make_console(out, color=color))
    return ANSI.sub("", out.getvalue())


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("color", [True, False])
def test_text_plan_prints_hostile_values_as_they_are(value: str, color: bool) -> None:
    text = text_of(value, color)
    shown = value.replace("\x1b", "\\x1b")
    assert f"Plan {shown}" in text
    assert f"/etc/containerd/{shown}.toml" in text
    assert text.count(shown) >= 10
    assert "\x1b" not in text  # after removing rich's own styles, no escape is left


def test_conceal_shows_on_a_colour_terminal() -> None:
    out = io.StringIO()
    print_plan_text(hostile_plan(CONCEAL), make_console(out, color=True))
    raw = out.getvalue()
    assert "\x1b[8m" not in raw  # SGR 8: conceal
    assert "hidden-text" in raw


@pytest.mark.parametrize("value", HOSTILE)
def test_markdown_keeps_hostile_values_inside_their_place(value: str) -> None:
    doc = plan_to_markdown(hostile_plan(value))
    assert "\x1b" not in doc
    outside_code = re.sub(r"(`{3,})[^\n]*\n.*?\n\1|(`+).*?\2", "", doc, flags=re.S)
    assert outside_code.count("</details>") == 1  # the node's own
    table = [line for line in doc.splitlines() if line.startswith("| 1 |")]
    assert len(table) == 1
    assert len(re.split(r"(?<!\\)\|", table[0])) == 7  # five cells: no `|` broke out


def test_markdown_fences_and_code_spans_cannot_be_closed_from_inside() -> None:
    block = md_fence("```\nrm -rf\n````\n", "diff")
    assert block.startswith("`````diff\n") and block.endswith("\n`````")
    assert md_code("a`b") == "``a`b``"


@pytest.mark.parametrize("value", HOSTILE)
def test_json_round_trips_hostile_values(value: str) -> None:
    text = plan_to_json(hostile_plan(value))
    assert "\x1b" not in text
    data = json.loads(text)
    assert data["name"] == value
    assert data["waves"][0]["nodes"][0]["name"] == value


@pytest.mark.parametrize("value", HOSTILE)
def test_progress_summary_and_live_table_print_hostile_values(value: str) -> None:
    out = io.StringIO()
    console = make_console(out, color=True)
    lines = ProgressLines(console)
    lines.node_started(1, value)
    lines.step_started(value, value)
    lines.step_finished(value, value, "failed", value)
    lines.node_finished(value, "failed", value)
    lines.halted(value)
    print_run_summary(console, value, "halted", value, {value: ("failed", value)})
    live = LiveProgress(console, {value: 1})
    live.node_started(1, value)
    live.step_started(value, value)
    live.halted(value)
    console.print(live.table())
    text = ANSI.sub("", out.getvalue())
    assert "\x1b" not in text
    assert text.count(value.replace("\x1b", "\\x1b")) >= 8


def test_safe_escapes_markup_and_shows_controls() -> None:
    assert safe("a\x07b\rc") == "a\\x07b\\x0dc"
    console = make_console(io.StringIO(), color=True)
    for value in HOSTILE:
        console.print(f"[bold]{safe(value)}[/bold]")  # no MarkupError
