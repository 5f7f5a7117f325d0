"""Host driver facts: each parser on the real tools' output, and the recorded round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rollout.driver.host import (
    AptVersion,
    driver_host_from_raw,
    matching_version,
    parse_driver_version,
    parse_held_packages,
    parse_installed_packages,
    parse_madison,
    parse_secure_boot,
    signed_module_package,
)
from rollout.driver.modules import (
    BootIdFact,
    LoadedModule,
    parse_lsmod,
    parse_unit_states,
    unload_order,
)
from rollout.fact import ProbeFailed
from rollout.facts import load_recorded_facts
from rollout.facts.recording import record_fleet

# `nvidia-smi --query-gpu=driver_version --format=csv,noheader` on a two-GPU node.
SMI_OK = "550.127.05\n550.127.05\nrollout-exit=0\n"
# After `apt-get install` of new packages with the old module still loaded (exit 18 is NVML's
# NVML_ERROR_LIB_RM_VERSION_MISMATCH).
SMI_MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\n"
    "NVML library version: 550.127\nrollout-exit=18\n"
)
SMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running.\n\nrollout-exit=9\n"
)
MADISON = """\
nvidia-driver | 535.216.01-1~deb12u1 | http://mirror.example/debian bookworm/non-free amd64 Packages
nvidia-driver | 535.183.01-1~deb12u1 | http://mirror.example/debian bookworm-updates/non-free amd64 Packages
nvidia-graphics-drivers | 535.216.01-1~deb12u1 | http://mirror.example/debian bookworm/non-free Sources
nvidia-driver-standin | 550.127.05-1 | file:/opt/rollout-lab/apt ./ Packages
N: Unable to locate package linux-modules-nvidia-550-6.1.0-18-amd64
"""  # noqa: E501
DPKG = "nvidia-driver\t535.183.01-1~deb12u1\thi \nnvidia-kernel-dkms:amd64\t535.183.01-1~deb12u1\tiF \nlibcuda1\t\tun \n"  # noqa: E501
LSMOD = """\
Module                  Size  Used by
nvidia_uvm           1814528  0
nvidia_drm             94208  0
nvidia_modeset       1556480  1 nvidia_drm
nvidia              62062592  2 nvidia_uvm,nvidia_modeset
drm_kms_helper        208896  1 nvidia_drm
"""
SYSTEMCTL = """\
Id=nvidia-persistenced.service
LoadState=loaded
ActiveState=active

ActiveState=inactive
LoadState=not-found
Id=nvidia-fabricmanager.service
"""


def test_nvidia_smi_version_mismatch_and_no_driver() -> None:
    ok = parse_driver_version(SMI_OK)
    assert (ok.version, ok.mismatch, ok.loaded) == ("550.127.05", False, True)
    mismatch = parse_driver_version(SMI_MISMATCH)
    assert (mismatch.version, mismatch.mismatch, mismatch.loaded) == (None, True, True)
    assert mismatch.exit_code == 18
    assert "version mismatch" in mismatch.describe()
    gone = parse_driver_version(SMI_NO_DRIVER)
    assert (gone.version, gone.mismatch, gone.loaded, gone.exit_code) == (None, False, False, 9)
    assert parse_driver_version("").describe() == "nvidia-smi is not installed"


def test_madison_lists_binary_versions_by_package_with_their_source() -> None:
    offered = parse_madison(MADISON)
    assert [v.version for v in offered["nvidia-driver"]] == [
        "535.216.01-1~deb12u1",
        "535.183.01-1~deb12u1",
    ]
    assert "nvidia-graphics-drivers" not in offered  # a source package does not install
    assert offered["nvidia-driver-standin"][0].source == "file:/opt/rollout-lab/apt ./ Packages"
    assert matching_version(offered["nvidia-driver"], "535.183.01") == AptVersion(
        "535.183.01-1~deb12u1",
        "http://mirror.example/debian bookworm-updates/non-free amd64 Packages",
    )
    assert matching_version(offered["nvidia-driver"], "550.127.05") is None
    assert AptVersion("1:550.127.05-0ubuntu1", "").upstream == "550.127.05"


def test_dpkg_query_status_and_holds() -> None:
    found = parse_installed_packages(DPKG)
    assert found["nvidia-driver"].installed
    assert not found["nvidia-kernel-dkms"].installed  # half-configured after a failed postinst
    assert found["nvidia-kernel-dkms"].present
    assert not found["libcuda1"].present
    assert parse_held_packages("nvidia-driver\nnvidia-kernel-dkms:amd64\n") == (
        "nvidia-driver",
        "nvidia-kernel-dkms",
    )


@pytest.mark.parametrize(
    ("text", "state"),
    [("SecureBoot enabled\n", True), ("SecureBoot disabled\n", False),
     ("EFI variables are not supported on this system\n", None), ("rollout-no-mokutil\n", None)],
)  # fmt: skip
def test_secure_boot(text: str, state: bool | None) -> None:
    assert parse_secure_boot(text) is state


def test_units_in_any_property_order_and_missing_ones() -> None:
    units = {u.unit: u for u in parse_unit_states(SYSTEMCTL)}
    assert units["nvidia-persistenced.service"].active
    assert not units["nvidia-fabricmanager.service"].exists
    assert not parse_unit_states("")[0].exists


def test_lsmod_references_and_unload_order() -> None:
    modules = parse_lsmod(LSMOD)
    assert [m.name for m in modules] == ["nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia"]
    assert all(m.held == 0 for m in modules)  # every reference is another module's
    order = unload_order(modules)
    # every module after the modules that use it: drm before modeset, both before nvidia
    assert order.index("nvidia_drm") < order.index("nvidia_modeset") < order.index("nvidia")
    assert order[-1] == "nvidia"
    held = parse_lsmod("nvidia 62062592 5 nvidia_uvm,nvidia_modeset,\n")
    assert held == (LoadedModule("nvidia", 5, ("nvidia_uvm", "nvidia_modeset")),)
    assert held[0].held == 3  # three references from processes (persistenced, a plugin...)
    assert parse_lsmod("nvidia 62062592 ² nvidia_uvm\n") == ()  # int() refuses '²'


def test_boot_id_must_be_a_uuid() -> None:
    fact = BootIdFact()
    assert fact.parse("0f5b1f0e-5d8e-4c3e-9a0b-2d3c4e5f6a7b\n", "gpu-1").startswith("0f5b")
    with pytest.raises(ProbeFailed, match="gpu-1"):
        fact.parse("cat: /proc/sys/kernel/random/boot_id: No such file\n", "gpu-1")


def test_driver_host_recorded_and_read_back(tmp_path: Path) -> None:
    raw = {
        "nvidia_smi": SMI_OK,
        "kernel": "6.1.0-18-amd64\n---\n---\n",
        "packages": DPKG,
        "held": "nvidia-driver\n",
        "apt": MADISON,
        "secure_boot": "SecureBoot enabled\n",
        "clients": SYSTEMCTL,
        "lsmod": LSMOD,
    }
    host = driver_host_from_raw(raw)
    assert host.kernel == "6.1.0-18-amd64" and host.secure_boot is True
    assert signed_module_package("550.127.05", host.kernel) == (
        "linux-modules-nvidia-550-6.1.0-18-amd64"
    )
    node_dir = tmp_path / "in" / "gpu-1"
    (node_dir / "files/etc/containerd").mkdir(parents=True)
    (node_dir / "files/etc/containerd/config.toml").write_text("version = 2\n")
    (node_dir / "node.yaml").write_text(
        yaml.safe_dump(
            {
                "containerd_version": "containerd github.com/containerd/containerd v1.7.24 x",
                "driver_host": raw,
            }
        )
    )
    fleet = load_recorded_facts(tmp_path / "in")
    assert fleet.nodes[0].driver_host == host
    record_fleet(fleet, tmp_path / "out")
    again = load_recorded_facts(tmp_path / "out")
    assert again.nodes[0].driver_host == host


def test_a_driver_host_record_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    node_dir = tmp_path / "gpu-1"
    (node_dir / "files/etc/containerd").mkdir(parents=True)
    (node_dir / "files/etc/containerd/config.toml").write_text("version = 2\n")
    (node_dir / "node.yaml").write_text(
        "containerd_version: containerd github.com/containerd/containerd v1.7.24 x\n"
        "driver_host:\n  nvidia-smi: '550.127.05'\n"
    )
    with pytest.raises(Exception, match=r"node\.yaml:3.*driver_host"):
        load_recorded_facts(tmp_path)
