"""Loading plan files: file-level problems, YAML quirks, locations and the typed result."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.changes.containerd.model import ContainerdChange
from rollout.changes.containerd.registrymodel import Capability, RegistryChange
from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.errors import InputErrors
from rollout.spec import NodeAmount, OnFailure, Spec, Weekday, load_spec, parse_spec

DATA = Path(__file__).parent / "data" / "spec"
MINIMAL = (DATA / "valid" / "minimal.yaml").read_text()


def spec_with_change(change: str) -> Spec:
    """The minimal plan with `change` (one YAML line) instead of its containerd change."""
    return parse_spec(
        MINIMAL.replace("  - containerd: {settings: {enable_cdi: true}}", f"  - {change}"), "p"
    )


def errors_of(text: str, name: str = "plan.yaml") -> str:
    with pytest.raises(InputErrors) as caught:
        parse_spec(text, name)
    return str(caught.value)


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(InputErrors) as caught:
        load_spec(tmp_path / "nope.yaml")
    assert f"{tmp_path / 'nope.yaml'}: file not found" in str(caught.value)


def test_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(InputErrors, match="is a directory"):
        load_spec(tmp_path)


def test_not_yaml_reports_parser_position() -> None:
    text = errors_of("apiVersion: rollout/v1\nkind: [Plan\nmetadata: {}\n")
    assert text.startswith("plan.yaml:3:9: not valid YAML")


def test_tab_indentation_is_not_yaml() -> None:
    assert "plan.yaml:2:1: not valid YAML" in errors_of("a:\n\tb: 1\n")


def test_empty_file() -> None:
    assert errors_of("") == "plan.yaml:1:1: the file is empty"
    assert errors_of("# only a comment\n") == "plan.yaml:1:1: the file is empty"


def test_top_level_must_be_a_mapping() -> None:
    assert "plan.yaml:1:1: expected a mapping" in errors_of("- a\n- b\n")
    assert 'found "just text"' in errors_of("just text\n")


def test_two_documents_are_an_error() -> None:
    assert "not valid YAML" in errors_of(MINIMAL + "---\n" + MINIMAL)


def test_duplicate_keys_are_errors_even_nested() -> None:
    text = errors_of(MINIMAL.replace("targets: {", "targets: {exclude: [], exclude: [], "))
    assert "plan.yaml:5:24: targets: duplicate key 'exclude' (first at line 5)" in text
    text = errors_of(MINIMAL + "metadata: {name: other}\n")
    assert "plan.yaml:8:1: duplicate key 'metadata' (first at line 4)" in text


def test_recursive_alias_is_an_error() -> None:
    assert "recursive" in errors_of("a: &x [*x]\n")


def test_merge_keys_work_and_later_keys_win() -> None:
    text = MINIMAL + "policy:\n  drain: &d {timeout_s: 10, force: true}\n  verify: {}\n"
    spec = parse_spec(text, "plan.yaml")
    assert spec.policy.drain.timeout_s == 10
    merged = MINIMAL.replace(
        "targets: {nodes: [gpu-node-1]}",
        "base: &b {nodes: [gpu-node-1]}\ntargets: {<<: *b, exclude: [gpu-node-2]}",
    )
    assert "unknown key 'base'" in errors_of(merged)


def test_clock_times_are_not_base_60() -> None:
    # YAML 1.1 reads 22:00 as 1320; rollout keeps it a time
    text = MINIMAL + "policy:\n  maintenance_window: {start: 22:00, end: 04:30}\n"
    window = parse_spec(text, "p").policy.maintenance_window
    assert window is not None
    assert (window.start.hour, window.start.minute, window.end.minute) == (22, 0, 30)


def test_errors_are_sorted_by_position_and_all_reported() -> None:
    text = errors_of(
        "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: BAD}\n"
        "targets: {nodes: [UPPER]}\nchanges: [{containerd: {}}]\npolicy: {waves: [0]}\n"
    )
    lines = [line for line in text.splitlines() if line.startswith("plan.yaml:")]
    assert [line.split(":")[1] for line in lines] == ["3", "4", "5", "6"]


def test_full_plan_is_typed() -> None:
    spec = load_spec(DATA / "valid" / "full.yaml")
    assert spec.metadata.name == "registry-mirror"
    kinds = [type(c) for c in spec.changes]
    assert kinds == [
        RegistryChange,
        RegistryChange,
        ContainerdChange,
        TimeSlicingChange,
        DriverUpgradeChange,
    ]
    mirror, default = spec.changes_of(RegistryChange)
    assert mirror.upstream == "https://registry.example.com:5000"
    assert mirror.hosts_toml_path == "/etc/containerd/certs.d/registry.example.com:5000/hosts.toml"
    assert mirror.endpoints[0].capabilities == (Capability.PULL, Capability.RESOLVE)
    assert not mirror.endpoints[0].plain_http and mirror.endpoints[1].plain_http
    assert default.host == "_default" and default.upstream is None
    (containerd,) = spec.changes_of(ContainerdChange)
    assert containerd.all_settings() == {
        "enable_cdi": True,
        "containerd.runtimes.nvidia.options.SystemdCgroup": True,
        "containerd.default_runtime_name": "nvidia",
    }
    assert ContainerdChange.split_key("a.b-c.d") == ("a", "b-c", "d")
    (sharing,) = spec.changes_of(TimeSlicingChange)
    assert sharing.replicas_for("nvidia.com/gpu") == 4
    assert sharing.replicas_for("nvidia.com/mig-1g.5gb") == 1
    assert sharing.config_document() == {
        "version": "v1",
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": False,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
            }
        },
    }
    (driver,) = spec.changes_of(DriverUpgradeChange)
    assert driver.mode is DriverMode.HOST
    assert driver.apt_packages == ("nvidia-driver", "nvidia-kernel-dkms")
    assert spec.policy.waves == (NodeAmount(1), NodeAmount(10, True), NodeAmount(25, True))
    assert spec.location_of("changes", 3, "time-slicing", "profile").line == 32


def test_defaults() -> None:
    spec = load_spec(DATA / "valid" / "minimal.yaml")
    policy = spec.policy
    assert policy.waves == (NodeAmount(1),)
    assert policy.max_unavailable == NodeAmount(1)
    assert policy.failure_budget == 0
    assert [str(label) for label in policy.halt_on_labels] == [
        "nvidia.com/gpu-driver-upgrade-state=upgrade-failed"
    ]
    assert policy.on_failure is OnFailure.ROLLBACK
    assert policy.drain.timeout_s == 300 and policy.drain.grace_period_s is None
    assert not policy.drain.force and not policy.drain.delete_emptydir_data
    assert policy.drain.pod_selector.is_empty
    assert policy.drain.skip_label == "nvidia.com/gpu-driver-upgrade-drain.skip"
    assert policy.verify.smoke_image == "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
    assert (policy.verify.smoke_timeout_s, policy.verify.gpu_wait_timeout_s) == (300, 300)
    assert policy.verify.containerd_restart_timeout_s == 60
    assert policy.maintenance_window is None
    assert spec.metadata.description == ""


def test_registry_defaults() -> None:
    spec = spec_with_change(
        "registry: {host: r.example.com, endpoints: [{url: 'https://m.example.com'}]}"
    )
    (registry,) = spec.changes_of(RegistryChange)
    assert registry.config_path == "/etc/containerd/certs.d"
    assert registry.upstream == "https://r.example.com"
    assert registry.endpoints[0].skip_verify is False
    assert registry.endpoints[0].ca_file is None


def test_operator_driver_and_time_slicing_defaults() -> None:
    spec = load_spec(DATA / "valid" / "operator-driver.yaml")
    (driver,) = spec.changes_of(DriverUpgradeChange)
    assert driver.mode is DriverMode.OPERATOR and driver.apt_packages == ()
    (sharing,) = spec.changes_of(TimeSlicingChange)
    assert (sharing.configmap.namespace, sharing.configmap.name) == (
        "gpu-operator",
        "time-slicing-config",
    )
    assert sharing.config.version == "v1"
    assert sharing.config.sharing.time_slicing.rename_by_default is True
    window = spec.policy.maintenance_window
    assert window is not None and window.days == (Weekday.FRI, Weekday.SAT)


def test_time_slicing_profile_without_sharing_shares_nothing() -> None:
    spec = spec_with_change("time-slicing: {profile: whole, config: {version: v1}}")
    (change,) = spec.changes_of(TimeSlicingChange)
    assert change.config_document() == {"version": "v1"}
    assert change.replicas_for("nvidia.com/gpu") == 1
    assert change.rename_by_default is False


def test_host_driver_default_package() -> None:
    spec = spec_with_change("driver-upgrade: {version: '535.154.05', mode: host}")
    assert spec.changes_of(DriverUpgradeChange)[0].apt_packages == ("nvidia-driver",)


def test_spec_is_immutable() -> None:
    spec = load_spec(DATA / "valid" / "minimal.yaml")
    with pytest.raises(ValueError):
        spec.policy.failure_budget = 3  # type: ignore[misc]
