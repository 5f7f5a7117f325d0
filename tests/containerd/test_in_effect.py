"""Effective changes with containerd's defaults: a default already in effect is a no-op, and
the diff shows only leaves whose loaded value changes (issue 7: `enable_cdi: (absent) -> true`
on a 2.1 node that loads `enable_cdi = true` by default).

Each test runs twice: with the real 2.1 binary behind the seam, and with the recorded defaults.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.containerd import (
    ContainerdVersion,
    DefaultsSource,
    Intent,
    LocalContainerd,
    RecordedDefaults,
    repair_shadowing,
    synthesize,
)
from tests.conftest import containerd_binary
from tests.containerd.nodes import MAIN, recorded_node
from tests.examples import PLAN as EXAMPLE_PLAN

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "examples" / "facts"
V21 = ContainerdVersion.from_series("2.1.9")
CERTS_D = "/etc/containerd/certs.d"
CDI = ("plugins", "io.containerd.cri.v1.runtime", "enable_cdi")
CONFIG_PATH = ("plugins", "io.containerd.cri.v1.images", "registry", "config_path")


@pytest.fixture(params=["real-binary", "recorded"])
def source(request: pytest.FixtureRequest) -> DefaultsSource:
    if request.param == "recorded":
        return RecordedDefaults()
    binary = containerd_binary("2.1")
    return LocalContainerd(locate=lambda series: binary)


def test_the_2_1_node_sets_neither_key_itself() -> None:
    node = recorded_node("gpu-node-2.x")
    assert not any("enable_cdi" in text or "config_path" in text for text in node.files.values())


def test_a_default_already_in_effect_is_not_written(source: DefaultsSource) -> None:
    node = recorded_node("gpu-node-2.x")
    intent = Intent.from_mapping({"enable_cdi": True, "registry.config_path": CERTS_D})
    result = synthesize(node, V21, intent, source)
    assert result.before.get(CDI) is True  # loaded by default: no file sets it
    assert [(c.path, c.before, c.after) for c in result.changes()] == [(CONFIG_PATH, "", CERTS_D)]
    assert not any(c.before is None for c in result.changes())  # no "(absent) -> ..."
    assert [s.setting.key for s in result.in_effect] == ["enable_cdi"]
    assert [w.path for w in result.writes] == [MAIN]
    assert "enable_cdi" not in result.writes[0].after
    assert "config_path" in result.writes[0].after
    assert any("enable_cdi = True is already in effect (the default" in n for n in result.notes)
    assert result.defaults_source == result.before.defaults_source != ""


def test_an_intent_that_is_all_defaults_is_a_noop(source: DefaultsSource) -> None:
    node = recorded_node("gpu-node-2.x")
    intent = Intent.from_mapping({"enable_cdi": True, "registry.config_path": ""})
    result = synthesize(node, V21, intent, source)
    assert result.is_noop and result.writes == () and result.changes() == []
    assert result.noop_reason is not None and "already effective" in result.noop_reason
    assert len(result.in_effect) == 2
    assert repair_shadowing(node, V21, intent, source).is_noop


def test_a_setting_against_its_default_is_written(source: DefaultsSource) -> None:
    node = recorded_node("gpu-node-2.x")
    result = synthesize(node, V21, Intent.from_mapping({"enable_cdi": False}), source)
    assert [(c.path, c.before, c.after) for c in result.changes()] == [(CDI, True, False)]
    assert result.in_effect == ()
    assert "enable_cdi = false" in result.writes[0].after


def test_the_source_is_named(source: DefaultsSource) -> None:
    node = recorded_node("gpu-node-2.x")
    result = synthesize(node, V21, Intent.from_mapping({"enable_cdi": False}), source)
    assert result.before.defaults_source == result.after.defaults_source
    assert result.defaults_source in (
        "containerd 2.1.9's own config dump",
        "recorded defaults of containerd 2.1",
    )
    if isinstance(source, RecordedDefaults):
        assert result.defaults_source == "recorded defaults of containerd 2.1"


# --- through `rollout plan --facts` ---------------------------------------------------------------


def _plan(tmp_path: Path, changes: str) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout/v1\nkind: Plan\nmetadata:\n  name: cdi\n"
        "targets:\n  selector: kubernetes.io/hostname=gpu-b-1\n"
        f"changes:\n{changes}"
        "policy:\n  waves: [1]\n  max_unavailable: 1\n"
    )
    return plan


def _node_without_toolkit_dropin(tmp_path: Path) -> Path:
    # gpu-b-1 with its toolkit drop-in gone (the toolkit removes it when it exits): no file
    # sets enable_cdi or config_path, so both hold containerd 2.1's defaults.
    facts = tmp_path / "facts"
    shutil.copytree(FACTS / "gpu-b-1", facts / "gpu-b-1")
    (facts / "gpu-b-1" / "files" / "etc" / "containerd" / "conf.d" / "99-nvidia.toml").unlink()
    return facts


def _planned_node(capsys: pytest.CaptureFixture[str], plan: Path, facts: Path) -> dict[str, Any]:
    assert main(["plan", str(plan), "--facts", str(facts), "--output", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    [node] = [n for wave in data["waves"] for n in wave["nodes"]]
    return node


@pytest.fixture(params=["real-binary", "recorded"])
def standard_source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard source of the plan command: the cached binary, or (none cached) recorded."""
    if request.param == "real-binary":
        containerd_binary("2.1")
    else:
        monkeypatch.setenv("ROLLOUT_CACHE", str(Path("/nonexistent/rollout-test-cache")))
    return str(request.param)


def test_plan_shows_no_absent_default_and_skips_what_is_in_effect(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, standard_source: str
) -> None:
    facts = _node_without_toolkit_dropin(tmp_path)
    plan = _plan(
        tmp_path,
        "  - containerd:\n      settings:\n        enable_cdi: true\n"
        "  - registry:\n      host: docker.io\n      server: https://registry-1.docker.io\n"
        "      endpoints:\n        - url: https://mirror.registry.internal:5000\n",
    )
    node = _planned_node(capsys, plan, facts)
    changes = node["effective_changes"]
    assert [(c["path"], c["before"], c["after"]) for c in changes] == [
        ('plugins."io.containerd.cri.v1.images".registry.config_path', "", CERTS_D)
    ]
    main_write = next(f for f in node["files"] if f["path"] == MAIN)
    assert "enable_cdi" not in main_write["after"]
    assert main(["plan", str(plan), "--facts", str(facts), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert "(absent)" not in text
    assert "enable_cdi" not in text.split("effective containerd config")[-1]


def test_plan_of_a_default_alone_is_a_noop(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, standard_source: str
) -> None:
    facts = _node_without_toolkit_dropin(tmp_path)
    plan = _plan(tmp_path, "  - containerd:\n      settings:\n        enable_cdi: true\n")
    node = _planned_node(capsys, plan, facts)
    assert node["files"] == [] and node["effective_changes"] == []
    assert main(["plan", str(plan), "--facts", str(facts), "--detailed-exitcode"]) == 0
    assert "No changes." in capsys.readouterr().out


def test_node_files_containerd_refuses_are_bad_input_named_by_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node file containerd itself cannot load (a string where it wants an integer) is bad
    input: exit 2, the node and its file named, containerd's own words, no local paths."""
    containerd_binary("1.7")
    facts = tmp_path / "facts"
    shutil.copytree(FACTS, facts)
    config = facts / "gpu-a-2" / "files" / "etc" / "containerd" / "config.toml"
    config.write_text('oom_score = "high"\n' + config.read_text())
    assert main(["plan", str(EXAMPLE_PLAN), "--facts", str(facts)]) == 2
    err = capsys.readouterr().err
    assert "gpu-a-2" in err and "/etc/containerd/config.toml" in err
    assert "refuses to load these files" in err and "high(string)" in err
    assert "Traceback" not in err
    # nothing of this machine's staging: no staged directory, no binary cache, no script
    assert "rollout-containerd." not in err and "rollout-dump" not in err and "/usr/bin" not in err
