"""The MIG layout engine (rollout.changes.mig.layout): the mig-parted config, the fit, the
devices a layout makes and what each strategy advertises; pure, from config text."""

from __future__ import annotations

import pytest

from rollout.changes.mig.layout import (
    A100_40GB,
    A100_80GB,
    MigConfigError,
    MigStrategy,
    advertised_resources,
    check_fit,
    gpu_entries,
    gpu_model,
    mixed_profiles,
    parse_mig_config,
    unused_memory,
)

# the lab's ConfigMap (docs/lab.md), as the MIG manager reads it
LAB_CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  all-3g.20gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  half:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - devices: [1]
      mig-enabled: false
  eight-small:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 8}
  too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}
"""
CONFIG = parse_mig_config(LAB_CONFIG)


def test_the_config_names_its_layouts_and_reads_each_entry() -> None:
    assert "all-balanced" in CONFIG.names()
    (entry,) = CONFIG.layouts["all-balanced"].entries
    assert entry.devices is None and entry.mig_enabled
    assert dict(entry.mig_devices) == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    half = CONFIG.layouts["half"]
    assert half.for_gpu(0) is not None and half.for_gpu(0).mig_enabled  # type: ignore[union-attr]
    assert half.for_gpu(1) is not None and not half.for_gpu(1).mig_enabled  # type: ignore[union-attr]
    assert half.for_gpu(2) is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("version: v2\nmig-configs: {}\n", "version 'v2'"),
        ("[1, 2]\n", "expected a mapping"),
        ("version: v1\nmig-configs: [a]\n", "not a mapping of layout names"),
        ("version: v1\nmig-configs: {x: [{devices: one, mig-enabled: true}]}\n", "devices must"),
        ("version: v1\nmig-configs: {x: [{devices: all}]}\n", "mig-enabled must"),
        (
            "version: v1\nmig-configs: {x: [{mig-enabled: true, mig-devices: {1g.5gb: x}}]}\n",
            "mig-devices must",
        ),
        ("version: v1\nmig-configs: {x: [\n", "not YAML"),
    ],
)
def test_a_config_not_in_mig_parted_v1_shape_says_what(text: str, said: str) -> None:
    with pytest.raises(MigConfigError, match=said):
        parse_mig_config(text)


def test_the_products_rollout_knows_and_their_profiles() -> None:
    assert gpu_model("NVIDIA A100-SXM4-40GB") is A100_40GB
    assert gpu_model("NVIDIA A100-SXM4-80GB") is A100_80GB
    assert gpu_model("Tesla T4") is None
    assert list(A100_40GB.profiles) == [
        "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"
    ]  # fmt: skip
    assert (A100_40GB.profiles["1g.10gb"].compute, A100_40GB.profiles["1g.10gb"].memory) == (1, 2)
    assert A100_40GB.profiles["2g.10gb"].most == 3
    assert next(iter(A100_80GB.profiles)) == "1g.10gb"


@pytest.mark.parametrize("name", ["all-disabled", "all-enabled", "all-1g.5gb", "all-balanced"])
def test_layouts_that_fit_an_a100_40gb(name: str) -> None:
    assert check_fit(CONFIG.layouts[name], A100_40GB, 2) == []


def test_eight_small_devices_do_not_fit_each_gpu() -> None:
    problems = check_fit(CONFIG.layouts["eight-small"], A100_40GB, 2)
    assert problems[0] == "GPU 0 (A100 40GB): 8 x 1g.5gb, at most 7 per GPU"
    assert (
        "GPU 1 (A100 40GB): 8 x 1g.5gb takes 8 compute and 8 memory slices, a GPU has 7 and 8"
        in problems
    )


def test_slices_beyond_the_gpu_do_not_fit_and_a_profile_of_another_card_is_named() -> None:
    (problem,) = check_fit(CONFIG.layouts["too-big"], A100_40GB, 1)
    assert "takes 8 compute and 9 memory slices" in problem
    (other,) = check_fit(CONFIG.layouts["all-1g.5gb"], A100_80GB, 1)
    assert other.startswith("GPU 0 (A100 80GB): no profile 1g.5gb (it has 1g.10gb,")


@pytest.mark.parametrize(
    ("name", "strategy", "advertised"),
    [
        ("all-1g.5gb", MigStrategy.MIXED, {"nvidia.com/mig-1g.5gb": 14}),
        ("all-1g.5gb", MigStrategy.SINGLE, {"nvidia.com/gpu": 14}),
        ("all-3g.20gb", MigStrategy.SINGLE, {"nvidia.com/gpu": 4}),
        ("all-disabled", MigStrategy.SINGLE, {"nvidia.com/gpu": 2}),
        ("all-disabled", MigStrategy.MIXED, {"nvidia.com/gpu": 2}),
        ("all-enabled", MigStrategy.MIXED, {}),
        (
            "all-balanced",
            MigStrategy.MIXED,
            {"nvidia.com/mig-1g.5gb": 4, "nvidia.com/mig-2g.10gb": 2, "nvidia.com/mig-3g.20gb": 2},
        ),
        ("half", MigStrategy.MIXED, {"nvidia.com/mig-1g.5gb": 7, "nvidia.com/gpu": 1}),
    ],
)
def test_what_a_layout_advertises_per_strategy(
    name: str, strategy: MigStrategy, advertised: dict[str, int]
) -> None:
    entries = gpu_entries(CONFIG.layouts[name], 2)
    assert advertised_resources(entries, strategy) == advertised


def test_a_gpu_the_layout_does_not_select_keeps_the_current_layout() -> None:
    only_first = parse_mig_config(
        "version: v1\nmig-configs:\n  first:\n    - devices: [0]\n      mig-enabled: true\n"
        "      mig-devices: {3g.20gb: 2}\n"
    ).layouts["first"]
    kept = gpu_entries(only_first, 2, CONFIG.layouts["all-1g.5gb"])
    assert advertised_resources(kept, MigStrategy.MIXED) == {
        "nvidia.com/mig-3g.20gb": 2,
        "nvidia.com/mig-1g.5gb": 7,
    }
    assert advertised_resources(gpu_entries(only_first, 2), MigStrategy.MIXED) == {
        "nvidia.com/mig-3g.20gb": 2,
        "nvidia.com/gpu": 1,
    }


def test_mixed_profiles_finds_more_than_one_kind_of_device() -> None:
    assert mixed_profiles(gpu_entries(CONFIG.layouts["all-1g.5gb"], 2)) == ["1g.5gb"]
    assert mixed_profiles(gpu_entries(CONFIG.layouts["all-balanced"], 2)) == [
        "1g.5gb", "2g.10gb", "3g.20gb"
    ]  # fmt: skip
    assert mixed_profiles(gpu_entries(CONFIG.layouts["half"], 2)) == ["1g.5gb", "MIG disabled"]


def test_a_layout_that_leaves_card_memory_unused_says_so() -> None:
    entries = gpu_entries(CONFIG.layouts["all-1g.5gb"], 2)
    assert unused_memory(entries, A100_40GB) == [
        "7 x 1g.5gb makes MIG devices of 35 of each A100 40GB's 40 GB"
    ]
    assert unused_memory(gpu_entries(CONFIG.layouts["all-3g.20gb"], 2), A100_40GB) == []
