"""A containerd release outside the measured ones: planned with a warning naming the model, or
refused where no model fits, from recorded facts (`plan --facts`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from tests.examples import FACTS, PLAN
from tests.hostile import HostileCase, run_case

# (release, the recorded node it is made from: gpu-a-2 runs 1.7.24, gpu-b-1 2.1.9)
RELEASES = {
    "1.7.27": "gpu-a-2",
    "1.7.24": "gpu-a-2",
    "2.1.9": "gpu-b-1",
    "2.2.0": "gpu-b-1",
    "2.4.1": "gpu-b-1",
}


def fleet_of(tmp_path: Path, releases: dict[str, str]) -> Path:
    """A facts directory with one node per release, each a copy of a recorded node."""
    facts = tmp_path / "facts"
    for release, source in releases.items():
        name = "node-" + release.replace(".", "-")
        shutil.copytree(FACTS / source, facts / name)
        node = facts / name / "node.yaml"
        text = re.sub(r"(?m)^name: .*$", f"name: {name}", node.read_text())
        text = re.sub(
            r"(?m)^containerd_version: .*$",
            f"containerd_version: containerd containerd.io {release} 05044ec0a9a7",
            text,
        )
        node.write_text(
            text.replace(f"kubernetes.io/hostname: {source}", f"kubernetes.io/hostname: {name}")
        )
    return facts


def test_unmeasured_releases_are_planned_with_the_model_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = fleet_of(tmp_path, RELEASES)
    assert main(["plan", str(PLAN), "--facts", str(facts), "--output", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    warned = {
        n["name"]: [w for w in n["warnings"] if "not a measured release" in w]
        for wave in data["waves"]
        for n in wave["nodes"]
    }
    assert warned["node-1-7-24"] == [] and warned["node-2-1-9"] == []
    measured = "(1.6.20, 1.7.24, 2.1.9)"
    again = "apply predicts again with the node's own binary"
    [note] = warned["node-1-7-27"]
    assert f"containerd 1.7.27 is not a measured release {measured}" in note
    assert (
        "used the containerd 1.7 model (whole plugin tables replaced, defaults of 1.7.24)" in note
    )
    assert again in note
    for release in ("2.2.0", "2.4.1"):
        [note] = warned["node-" + release.replace(".", "-")]
        assert f"containerd {release} is not a measured release {measured}" in note
        assert (
            "used the containerd 2.1 model (plugin tables deep-merged, defaults of 2.1.9)" in note
        )
        assert again in note


@pytest.mark.parametrize("release", ["1.5.18", "3.0.0"])
def test_a_release_no_model_fits_is_refused(
    release: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def setup(work: Path) -> None:
        fleet_of(work, {release: "gpu-a-2"})

    case = HostileCase(
        f"containerd-{release}",
        argv=("plan", str(PLAN), "--facts", "{tmp}/facts"),
        setup=setup,
        where="node.yaml:3",
        says=(f"containerd {release} is not supported", "1.6-1.7 and 2.x only"),
        max_s=60.0,  # a refusal, not a bomb: no time limit of its own on a busy machine
    )
    run_case(case, tmp_path, monkeypatch)
