"""Host-mode driver plans from recorded facts: decisions, refusals, warnings, the three outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rollout.changes.driver.hostplan import DriverNotInstallable
from rollout.cli import main
from rollout.errors import InputErrors
from rollout.facts import load_recorded_facts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import parse_spec
from tests.examples import REPO

KERNEL = "6.1.0-18-amd64"
OLD, NEW, MISSING = "535.183.01", "550.127.05", "560.35.03"
MADISON = (
    f"nvidia-driver-standin | {NEW}-1 | file:/opt/rollout-lab/apt ./ Packages\n"
    f"nvidia-driver-standin | {OLD}-1 | file:/opt/rollout-lab/apt ./ Packages\n"
)


def plan_text(reload: str = "reboot", version: str = NEW, extra: str = "") -> str:
    return f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: driver-host}}
targets: {{selector: "nvidia.com/gpu.present=true"}}
changes:
  - driver-upgrade: {{version: "{version}", mode: host, packages: [nvidia-driver-standin]}}
policy:
  waves: [1, "50%"]
  driver: {{reload: {reload}{extra}}}
"""


def node_yaml(
    name: str,
    *,
    installed: str = OLD,
    held: bool = True,
    secure_boot: str = "rollout-no-mokutil\n",
    madison: str = MADISON,
    labels: dict[str, str] | None = None,
) -> dict[str, object]:
    return {
        "name": name,
        "containerd_version": "containerd github.com/containerd/containerd v1.7.24 x",
        "labels": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.deploy.device-plugin": "true",
            "nvidia.com/gpu.deploy.dcgm": "false",
            **(labels or {}),
        },
        "gpus": {"count": 1, "driver_version": installed, "uuids": ["GPU-1111-2222"]},
        "driver_host": {
            "nvidia_smi": f"{installed}\nrollout-exit=0\n",
            "kernel": f"{KERNEL}\n---\n---\n",
            "packages": f"nvidia-driver-standin\t{installed}-1\tii \n",
            "held": "nvidia-driver-standin\n" if held else "",
            "apt": madison,
            "secure_boot": secure_boot,
            "clients": "Id=nvidia-persistenced.service\nLoadState=loaded\nActiveState=active\n",
            "lsmod": "nvidia 1000 0\n",
        },
    }


def write_facts(root: Path, nodes: list[dict[str, object]]) -> Path:
    for node in nodes:
        node_dir = root / str(node["name"])
        (node_dir / "files/etc/containerd").mkdir(parents=True)
        (node_dir / "files/etc/containerd/config.toml").write_text("version = 2\n")
        (node_dir / "node.yaml").write_text(yaml.safe_dump(node))
    return root


def plan_of(tmp_path: Path, nodes: list[dict[str, object]], text: str = ""):  # type: ignore[no-untyped-def]
    spec = parse_spec(text or plan_text(), "plan.yaml")
    fleet = load_recorded_facts(write_facts(tmp_path / "facts", nodes))
    return build_plan(spec, "plan.yaml", fleet, load_playbooks())


def test_a_node_at_the_old_version_goes_through_every_host_step(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, [node_yaml("gpu-1"), node_yaml("gpu-2", installed=NEW)])
    one, two = plan.nodes
    acting = [s.kind for s in one.steps if s.changes]
    assert acting == [
        "preflight", "gates.baseline", "cordon", "drain", "driver.pause", "driver.unload",
        "driver.install", "driver.reload", "driver.verify", "driver.resume", "gpu.wait",
        "gpu.smoke", "gates", "uncordon",
    ]  # fmt: skip
    install = next(s for s in one.steps if s.kind == "driver.install")
    assert install.action is not None
    assert f"nvidia-driver-standin={NEW}-1" in install.action
    pause = next(s for s in one.steps if s.kind == "driver.pause")
    assert pause.action is not None and "nvidia.com/gpu.deploy.device-plugin" in pause.action
    assert "dcgm" not in pause.action  # `false` stays as it is
    assert one.driver is not None
    assert (one.driver.before, one.driver.after, one.driver.kernel, one.driver.reboot) == (
        OLD, NEW, KERNEL, "yes",
    )  # fmt: skip
    # installed, loaded and held already: nothing at all happens on the node
    assert not two.changes and two.driver is None


def test_the_reboot_decision_follows_policy_driver(tmp_path: Path) -> None:
    modules = plan_of(tmp_path / "a", [node_yaml("gpu-1")], plan_text("modules"))
    assert modules.nodes[0].driver is not None and modules.nodes[0].driver.reboot == "no"
    reload = next(s for s in modules.nodes[0].steps if s.kind == "driver.reload")
    assert reload.action is not None and "no reboot" in reload.action
    busy = plan_of(
        tmp_path / "b", [node_yaml("gpu-1")], plan_text("modules", extra=", reboot_if_busy: true")
    )
    assert busy.nodes[0].driver is not None
    assert busy.nodes[0].driver.reboot == "only if a module stays in use"


def test_an_unheld_package_at_the_version_is_still_work(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, [node_yaml("gpu-1", installed=NEW, held=False)])
    assert plan.nodes[0].changes


def test_a_version_the_apt_sources_do_not_offer_is_refused_naming_node_and_offer(
    tmp_path: Path,
) -> None:
    with pytest.raises(DriverNotInstallable) as caught:
        plan_of(tmp_path, [node_yaml("gpu-1")], plan_text(version=MISSING))
    message = str(caught.value)
    assert "plan.yaml:6" in message  # the change's version line
    assert f"node gpu-1: nvidia-driver-standin {MISSING} cannot be installed" in message
    assert f"{NEW}-1, {OLD}-1" in message and "file:/opt/rollout-lab/apt" in message
    nothing = node_yaml("gpu-2", madison="")
    with pytest.raises(DriverNotInstallable, match="offer no version of nvidia-driver-standin"):
        plan_of(tmp_path / "b", [nothing])


def test_the_cli_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = write_facts(tmp_path / "facts", [node_yaml("gpu-1")])
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text(version=MISSING))
    assert main(["plan", str(plan), "--facts", str(facts)]) == 2
    assert "node gpu-1" in capsys.readouterr().err


def test_secure_boot_without_a_signed_module_package_warns(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, [node_yaml("gpu-1", secure_boot="SecureBoot enabled\n")])
    (warning,) = plan.nodes[0].warnings
    assert "Secure Boot is enabled on gpu-1" in warning
    assert f"linux-modules-nvidia-550-{KERNEL}" in warning
    signed = MADISON + (
        f"linux-modules-nvidia-550-{KERNEL} | 6.1.0-18.1 | http://mirror.example/x Packages\n"
    )
    fine = plan_of(
        tmp_path / "b", [node_yaml("gpu-1", secure_boot="SecureBoot enabled\n", madison=signed)]
    )
    assert fine.nodes[0].warnings == ()
    off = plan_of(tmp_path / "c", [node_yaml("gpu-1", secure_boot="SecureBoot disabled\n")])
    assert off.nodes[0].warnings == ()


def test_recorded_facts_without_driver_host_plan_with_a_warning(tmp_path: Path) -> None:
    node = node_yaml("gpu-1")
    del node["driver_host"]
    plan = plan_of(tmp_path, [node])
    assert plan.nodes[0].changes
    assert any("no host driver facts" in w for w in plan.nodes[0].warnings)


def test_policy_driver_fields_are_checked() -> None:
    with pytest.raises(InputErrors) as caught:
        parse_spec(plan_text("reboot", extra=", reboot_if_busy: true"), "plan.yaml")
    assert "plan.yaml:9" in str(caught.value)
    assert "policy.driver.reboot_if_busy: `reboot_if_busy` applies only to reload: modules" in str(
        caught.value
    )
    with pytest.raises(InputErrors, match=r"policy\.driver\.reload: expected one of"):
        parse_spec(plan_text("kexec"), "plan.yaml")
    with pytest.raises(InputErrors, match="reboot_timeout_s"):
        parse_spec(plan_text("reboot", extra=", reboot_timeout_s: 5"), "plan.yaml")


@pytest.mark.parametrize("output", ["text", "markdown", "json"])
def test_plan_output_shows_from_to_kernel_and_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    facts = write_facts(tmp_path / "facts", [node_yaml("gpu-1"), node_yaml("gpu-2")])
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text("modules"))
    assert main(["plan", str(plan), "--facts", str(facts), "--output", output]) == 0
    out = capsys.readouterr().out
    if output == "json":
        nodes = [n for w in json.loads(out)["waves"] for n in w["nodes"]]
        assert [n["driver"] for n in nodes] == [
            {"mode": "host", "before": OLD, "after": NEW, "kernel": KERNEL, "reboot": "no"}
        ] * 2
    elif output == "markdown":
        # grouped: the two nodes planned alike show the move once; --full keeps the table
        assert f"- driver {OLD} -&gt; {NEW} (host mode), kernel {KERNEL}, reboots: no" in out
        assert "Nodes: gpu-\\[1-2\\]" in out
        assert main(["plan", str(plan), "--facts", str(facts), "-o", output, "--full"]) == 0
        full = capsys.readouterr().out
        assert "| wave | node | driver | kernel | reboots |" in full
        assert f"| 1 | gpu-1 | {OLD} → {NEW} (host) | {KERNEL} | no |" in full
    else:
        assert f"driver {OLD} -> {NEW} (host mode), kernel {KERNEL}, reboots: no" in out


def test_the_example_host_plan_plans_on_lab_like_facts(tmp_path: Path) -> None:
    text = (REPO / "examples" / "driver-host.yaml").read_text()
    nodes = [node_yaml(f"lab-node-{i}") for i in range(1, 5)]
    plan = plan_of(tmp_path, nodes, text)
    assert [len(w.nodes) for w in plan.waves] == [1, 2, 1]
    assert all(n.driver is not None and n.driver.after == NEW for n in plan.nodes)
    assert all(n.driver is not None and n.driver.reboot == "only if a module stays in use"
               for n in plan.nodes)  # fmt: skip
