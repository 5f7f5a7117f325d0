"""MIG layouts whose entries select GPU models by PCI device id (`device-filter`), as the GPU
Operator's own default-mig-parted-config does: the engine applies mig-parted's rule, the
nodes' ids are read as a fact, recorded and read back, and a plan over facts without them is
refused rather than guessed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from rollout.changes import node_reads
from rollout.changes.mig.layout import (
    A100_40GB,
    A100_80GB,
    GpuModel,
    MigConfigError,
    MigStrategy,
    UnknownDeviceId,
    advertised_resources,
    check_fit,
    gpu_entries,
    parse_mig_config,
)
from rollout.cli import main
from rollout.facts import FleetFacts, NodeFacts
from rollout.facts.gpu import GpuQueryFact, parse_gpu_query
from rollout.facts.recorded import load_recorded_facts
from rollout.facts.recording import record_fleet
from rollout.spec import parse_spec
from tests.examples import FACTS
from tests.unit.test_mig_plan import CONFIGMAP, make_context, make_node, plan, refusal
from tests.unit.test_mig_plan_cli import MIG_LABELS, PLAN_TEXT, recorded_facts

A100_40GB_ID = "0x20B010DE"
A100_80GB_ID = "0x20B210DE"
A30_ID = "0x20B710DE"
T4_ID = "0x1EB810DE"

# the GPU Operator's default-mig-parted-config, its all-balanced and all-1g.10gb as shipped
REAL_CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    # H100-80GB, H800-80GB, A100-80GB, A800-80GB
    - device-filter: ["0x233010DE", "0x233110DE", "0x232210DE", "0x20B210DE", "0x20B510DE", \
"0x20F310DE", "0x20F510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    # A100-40GB, A800-40GB
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 4
  all-balanced:
    # H100-80GB
    - device-filter: ["0x233110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "4g.40gb": 1
    # A100-40GB
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
    # A100-80GB
    - device-filter: ["0x20B210DE", "0x20B510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
    # A30-24GB
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1
"""
CONFIG = parse_mig_config(REAL_CONFIG)


def advertised(layout: str, ids: tuple[str, ...]) -> dict[str, int]:
    entries = gpu_entries(CONFIG.layouts[layout], len(ids), None, ids)
    return advertised_resources(entries, MigStrategy.MIXED)


@pytest.mark.parametrize(
    ("layout", "device_id", "made"),
    [
        (
            "all-balanced",
            A100_40GB_ID,
            {"nvidia.com/mig-1g.5gb": 4, "nvidia.com/mig-2g.10gb": 2, "nvidia.com/mig-3g.20gb": 2},
        ),
        (
            "all-balanced",
            A100_80GB_ID,
            {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-3g.40gb": 2},
        ),
        ("all-1g.10gb", A100_40GB_ID, {"nvidia.com/mig-1g.10gb": 8}),
        ("all-1g.10gb", A100_80GB_ID, {"nvidia.com/mig-1g.10gb": 14}),
    ],
)
def test_each_gpu_model_gets_the_entry_its_device_id_matches(
    layout: str, device_id: str, made: dict[str, int]
) -> None:
    assert advertised(layout, (device_id, device_id)) == made


@pytest.mark.parametrize("layout", ["all-balanced", "all-1g.10gb"])
@pytest.mark.parametrize(
    ("model", "device_id"), [(A100_40GB, A100_40GB_ID), (A100_80GB, A100_80GB_ID)]
)
def test_the_fit_checks_only_the_entry_of_the_gpus_model(
    layout: str, model: GpuModel, device_id: str
) -> None:
    assert check_fit(CONFIG.layouts[layout], model, 2, (device_id, device_id)) == []


def test_without_the_filter_the_last_entry_would_be_applied_to_every_gpu() -> None:
    # what rollout did before it read device-filter: A30's 1g.6gb on an A100 40GB
    unfiltered = parse_mig_config(REAL_CONFIG.replace("device-filter", "x-ignored"))
    assert check_fit(unfiltered.layouts["all-balanced"], A100_40GB, 1) == [
        "GPU 0 (A100 40GB): no profile 1g.6gb, 2g.12gb (it has 1g.5gb, 1g.10gb, 2g.10gb, "
        "3g.20gb, 4g.20gb, 7g.40gb)"
    ]


def test_a_gpu_no_entry_matches_is_left_as_it_is() -> None:
    # mig-parted walks only the GPUs an entry matches; the others keep their layout
    current = CONFIG.layouts["all-1g.10gb"]
    entries = gpu_entries(CONFIG.layouts["all-balanced"], 2, current, (A100_40GB_ID, T4_ID))
    assert entries[0] == CONFIG.layouts["all-balanced"].entries[1]
    assert entries[1].mig_enabled is False  # the T4: all-1g.10gb matched it neither
    assert advertised("all-balanced", (T4_ID,)) == {"nvidia.com/gpu": 1}


def test_a_filter_as_one_string_and_as_a_list() -> None:
    assert advertised("all-balanced", (A30_ID,)) == {
        "nvidia.com/mig-1g.6gb": 2,
        "nvidia.com/mig-2g.12gb": 1,
    }
    assert CONFIG.layouts["all-balanced"].entries[3].device_filter == (0x20B710DE,)
    assert CONFIG.layouts["all-balanced"].entries[2].device_filter == (0x20B210DE, 0x20B510DE)


@pytest.mark.parametrize("device_id", ["0x20b010de", "0x20B010DE", "0X20B010de"])
def test_device_ids_compare_as_numbers_whatever_their_case(device_id: str) -> None:
    assert advertised("all-1g.10gb", (device_id,)) == {"nvidia.com/mig-1g.10gb": 4}
    lower = parse_mig_config(REAL_CONFIG.lower())
    entries = gpu_entries(lower.layouts["all-1g.10gb"], 1, None, (device_id,))
    assert entries[0].mig_devices == {"1g.10gb": 4}


def test_a_filter_mig_parted_cannot_read_matches_no_gpu() -> None:
    config = parse_mig_config(
        "version: v1\nmig-configs:\n  odd:\n    - device-filter: 20B010DE\n"
        "      devices: all\n      mig-enabled: true\n      mig-devices: {1g.5gb: 7}\n"
    )
    assert gpu_entries(config.layouts["odd"], 1, None, (A100_40GB_ID,))[0].mig_enabled is False


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("[1, 2]", "device-filter must be a PCI device id or a list"),
        ('"0x20B010DE:0x145F10DE"', "names a subsystem id; rollout reads each GPU's pci.device_id"),
    ],
)
def test_a_filter_rollout_cannot_follow_is_refused(value: str, said: str) -> None:
    with pytest.raises(MigConfigError, match=said):
        parse_mig_config(
            f"version: v1\nmig-configs:\n  odd:\n    - device-filter: {value}\n"
            "      devices: all\n      mig-enabled: false\n"
        )


def test_a_filtered_layout_needs_the_ids_and_an_unfiltered_one_does_not() -> None:
    with pytest.raises(UnknownDeviceId, match="GPU 0: its PCI device id is not known"):
        gpu_entries(CONFIG.layouts["all-balanced"], 2)
    assert gpu_entries(CONFIG.layouts["all-disabled"], 2)[0].mig_enabled is False


@pytest.mark.parametrize("empty", ['""', "[]"])
def test_an_empty_filter_matches_every_gpu(empty: str) -> None:
    config = parse_mig_config(
        f"version: v1\nmig-configs:\n  any:\n    - device-filter: {empty}\n"
        "      devices: all\n      mig-enabled: true\n      mig-devices: {1g.5gb: 7}\n"
    )
    assert config.layouts["any"].entries[0].device_filter is None
    assert gpu_entries(config.layouts["any"], 1)[0].mig_devices == {"1g.5gb": 7}


def test_a_gpu_nvidia_smi_did_not_list_is_not_guessed() -> None:
    with pytest.raises(UnknownDeviceId, match="GPU 1: its PCI device id is not known"):
        gpu_entries(CONFIG.layouts["all-balanced"], 2, None, (A100_40GB_ID,))


def test_the_gpu_query_reads_each_gpus_device_id_in_its_one_command() -> None:
    assert GpuQueryFact().command() == [
        "nvidia-smi",
        "--query-gpu=uuid,name,driver_version,pci.device_id",
        "--format=csv,noheader",
    ]
    text = (
        "GPU-1, NVIDIA A100-SXM4-40GB, 550.90.07, 0x20B010DE\n"
        "GPU-2, NVIDIA A100-SXM4-80GB, 550.90.07, 0x20B210DE\n"
    )
    assert parse_gpu_query(text).device_ids == (A100_40GB_ID, A100_80GB_ID)
    assert parse_gpu_query("").device_ids is None  # no GPU listed: nothing to know
    # the query of facts recorded before the ids were read: not known, not none
    assert parse_gpu_query("GPU-1, NVIDIA A100-SXM4-40GB, 550.90.07\n").device_ids is None
    # read in the node's one probe: a MIG plan reads nothing of the node after it
    mig = parse_spec(PLAN_TEXT.replace("LAYOUT", "all-balanced"), "plan.yaml")
    assert node_reads(mig.changes) == []


REAL_CONFIGMAPS = {CONFIGMAP: {"config.yaml": REAL_CONFIG}}


def with_ids(node: NodeFacts, ids: tuple[str, ...]) -> NodeFacts:
    return replace(node, gpus=replace(node.gpus, device_ids=ids))


def test_the_plan_forecasts_the_entry_of_the_nodes_model() -> None:
    node = with_ids(make_node(), (A100_40GB_ID, A100_40GB_ID))
    work = plan(*make_context("all-balanced", node, configmaps=REAL_CONFIGMAPS))
    assert work.advertised == {
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 2,
    }


def test_a_filtered_layout_over_facts_without_the_ids_is_refused_saying_what_to_do() -> None:
    said = refusal(*make_context("all-balanced", make_node(), configmaps=REAL_CONFIGMAPS))
    assert said == (
        "node gpu-1: layout 'all-balanced' selects GPU models by PCI device id "
        "(device-filter), and the node's facts from facts/ lack its GPUs' ids (GPU 0: its PCI "
        "device id is not known) | record the facts again with `rollout facts record` (it "
        "reads the ids), or plan against the live cluster"
    )


def test_an_unfiltered_layout_plans_without_the_ids() -> None:
    ctx = make_context("all-disabled", make_node(config="all-1g.10gb"), configmaps=REAL_CONFIGMAPS)
    work = plan(*ctx)
    assert work.advertised == {"nvidia.com/gpu": 2}


def test_the_ids_are_recorded_and_read_back(tmp_path: Path) -> None:
    fleet = load_recorded_facts(FACTS)
    ids = (A100_40GB_ID, A100_80GB_ID)
    recorded = FleetFacts([with_ids(fleet.nodes[0], ids), *fleet.nodes[1:]], fleet.cluster, "x")
    record_fleet(recorded, tmp_path / "facts")
    read = load_recorded_facts(tmp_path / "facts")
    assert read.nodes[0].gpus.device_ids == ids
    assert read.nodes[1].gpus.device_ids is None


def test_rollout_plan_over_recorded_facts_refuses_without_the_ids_and_plans_with_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = recorded_facts(tmp_path, MIG_LABELS)
    cluster = yaml.safe_load((facts / "cluster.yaml").read_text())
    cluster["configmaps"][CONFIGMAP] = {"config.yaml": REAL_CONFIG}
    (facts / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN_TEXT.replace("LAYOUT", "all-balanced"))
    capsys.readouterr()
    assert main(["plan", str(plan_file), "--facts", str(facts)]) == 2
    assert "record the facts again with `rollout facts record`" in capsys.readouterr().err
    node = facts / "gpu-a-1" / "node.yaml"
    document = yaml.safe_load(node.read_text())
    document["gpus"]["device_ids"] = [A100_40GB_ID.lower()] * 4
    node.write_text(yaml.safe_dump(document))
    assert main(["plan", str(plan_file), "--facts", str(facts)]) == 0
    out = capsys.readouterr().out
    assert "nvidia.com/mig-1g.5gb 0 -> 8, nvidia.com/mig-2g.10gb 0 -> 4" in out
