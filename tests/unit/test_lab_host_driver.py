"""The lab's reading of a node's driver state: whose driver it is (the driver container's, or
one the node's packages installed over it), and whether the validator's driver-validation
(nvidia-smi on the node) passes."""

from __future__ import annotations

import os
from pathlib import Path

from rollout.lab.simulation.driverpods import (
    DRIVER_VERSION_FILE,
    MODULE_VERSION_FILE,
    driver_validates,
    read_host_driver,
    write_driver_state,
)


def write(root: Path, relative: Path, version: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(version + "\n")


def test_the_driver_containers_own_install_is_no_host_driver(tmp_path: Path) -> None:
    write_driver_state(tmp_path, "535.183.01")
    assert read_host_driver(tmp_path) is None
    assert driver_validates(tmp_path)


def test_a_package_installed_over_the_container_is_a_host_driver(tmp_path: Path) -> None:
    write_driver_state(tmp_path, "535.183.01")
    write(tmp_path, DRIVER_VERSION_FILE, "550.127.05")  # what the package's postinst does
    assert read_host_driver(tmp_path) == "550.127.05"
    # the module is still the old one until a reload or a reboot: nvidia-smi fails
    assert not driver_validates(tmp_path)
    write(tmp_path, MODULE_VERSION_FILE, "550.127.05")
    assert driver_validates(tmp_path)


def test_a_package_reinstalling_the_containers_version_is_a_host_driver(tmp_path: Path) -> None:
    write_driver_state(tmp_path, "535.183.01")
    library = tmp_path / DRIVER_VERSION_FILE
    later = library.stat().st_mtime_ns + 1_000_000_000
    write(tmp_path, DRIVER_VERSION_FILE, "535.183.01")  # a host-mode upgrade back to it
    os.utime(library, ns=(later, later))  # the postinst ran after the container's install
    assert read_host_driver(tmp_path) == "535.183.01"


def test_a_node_the_container_never_served_has_no_host_driver_to_report(tmp_path: Path) -> None:
    write(tmp_path, DRIVER_VERSION_FILE, "535.183.01")
    assert read_host_driver(tmp_path) is None


def test_a_node_without_driver_files_or_root_has_nothing_to_judge(tmp_path: Path) -> None:
    assert driver_validates(tmp_path)
    assert driver_validates(None)
    write(tmp_path, DRIVER_VERSION_FILE, "535.183.01")  # a library without a loaded module
    assert not driver_validates(tmp_path)
