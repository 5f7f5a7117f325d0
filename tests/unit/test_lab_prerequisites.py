"""What `lab up` checks before it touches anything: the `lab` extra's Python modules, the
compiled CRI API, the kernel's namespaces and cgroups; each missing part with its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rollout.errors import ExitCode
from rollout.lab.mounts import Mount
from rollout.lab.prerequisites import (
    KUBELET_CRI,
    CriNeeds,
    Missing,
    PrerequisitesMissing,
    find_missing_namespaces,
    find_node_cgroups,
)

EXTRA = "pip install 'gpu-rollout[lab]' (in a checkout: scripts/setup --lab)"


def test_a_module_of_the_lab_extra_that_does_not_import_is_missing_with_the_install_command(
    tmp_path: Path,
) -> None:
    modules = (("rollout_absent_grpc", "grpcio"), ("json", "json"))
    (tmp_path / "api_pb2.py").write_text("")
    (tmp_path / "api_pb2_grpc.py").write_text("")
    missing = CriNeeds(modules=modules, api_dir=tmp_path).find_missing()
    assert missing == [Missing("Python module rollout_absent_grpc (grpcio)", EXTRA)]


def test_a_missing_compiled_cri_api_is_named_with_the_script_that_compiles_it(
    tmp_path: Path,
) -> None:
    fetch = "run scripts/fetch-cri-api from rollout's source (or scripts/setup --lab)"
    # the modules missing too: the API is only looked for, each part said once
    without = CriNeeds(modules=(("rollout_absent_grpc", "grpcio"),), api_dir=tmp_path)
    assert without.find_missing() == [
        Missing("Python module rollout_absent_grpc (grpcio)", EXTRA),
        Missing(f"compiled CRI API ({tmp_path / 'api_pb2.py'})", fetch),
    ]
    # the modules there: the API is loaded, and says why it cannot be
    (found,) = CriNeeds(modules=(), api_dir=tmp_path).find_missing()
    assert found.what == "the lab kubelet's CRI client"
    assert found.fix == f"the compiled CRI API is missing ({tmp_path / 'api_pb2.py'}): {fetch}"


def test_the_lab_extra_is_every_module_pyproject_lists_for_it() -> None:
    assert {package for _, package in KUBELET_CRI.modules} == {
        "grpcio",
        "grpcio-tools",
        "protobuf",
    }
    assert KUBELET_CRI.api_dir is None  # the cache's, where scripts/fetch-cri-api writes


def test_namespaces_the_kernel_lacks_are_named(tmp_path: Path) -> None:
    (tmp_path / "self" / "ns").mkdir(parents=True)
    for kind in ("mnt", "pid", "uts"):
        (tmp_path / "self" / "ns" / kind).touch()
    assert [m.what for m in find_missing_namespaces(tmp_path)] == [
        "net namespaces",
        "ipc namespaces",
    ]
    assert find_missing_namespaces() == []  # this kernel has them all


def test_nodes_need_cgroup2_or_the_v1_systemd_hierarchy() -> None:
    v1_cpu = Mount(Path("/sys/fs/cgroup/cpu"), "cgroup", ("rw", "cpu"))
    v1_systemd = Mount(Path("/sys/fs/cgroup/systemd"), "cgroup", ("rw", "name=systemd"))
    unified = Mount(Path("/sys/fs/cgroup"), "cgroup2", ("rw",))
    assert find_node_cgroups([v1_cpu]) == []
    assert find_node_cgroups([v1_cpu, v1_systemd]) == [v1_systemd]
    assert find_node_cgroups([unified]) == [unified]


def test_missing_prerequisites_are_bad_input() -> None:
    error = PrerequisitesMissing([Missing("Python module grpc (grpcio)", EXTRA)])
    assert error.exit_code == ExitCode.BAD_INPUT == 2
    assert str(error) == (
        f"the lab cannot start on this machine:\n  - Python module grpc (grpcio): {EXTRA}"
    )


def test_lab_up_without_grpc_refuses_at_once_and_starts_nothing(tmp_path: Path) -> None:
    """The real `rollout lab up`, in an interpreter where grpc cannot be imported (as without
    the `lab` extra): exit 2 with the install command, and no lab directory made."""
    lab_dir = tmp_path / "lab"
    # None in sys.modules is Python's own mark for a module that must not import
    program = (
        "import sys; sys.modules['grpc'] = None\n"
        "from rollout.cli import main\n"
        f"sys.exit(main(['lab', 'up', '--lab-dir', {str(lab_dir)!r}, '--api-port', '0']))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
        )
    finally:
        if lab_dir.exists():  # it started after all: leave nothing up
            subprocess.run(
                [sys.executable, "-m", "rollout", "lab", "down", "--lab-dir", str(lab_dir)]
            )
    assert done.returncode == 2, done.stderr
    assert f"  - Python module grpc (grpcio): {EXTRA}\n" in done.stderr
    assert not lab_dir.exists()
