"""The lab's CRI pieces that need no node: the CRI log format, the registry's images, the
`nvidia` handlers' stand-in runtime."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

from rollout.lab.cri import read_cri_log
from rollout.lab.registryimages import ImageRef, _build_image, served_namespaces
from tests.script_modules import import_lab_script


def test_cri_log_joins_partial_lines_and_keeps_both_streams() -> None:
    text = (
        "2026-12-01T04:16:03.1Z stdout P GPU 0: NVIDIA A100 \n"
        "2026-12-01T04:16:03.2Z stdout F (UUID: GPU-aaaa)\n"
        "2026-12-01T04:16:03.3Z stderr F warning: slow\n"
        "2026-12-01T04:16:03.4Z stdout F \n"
    )
    assert read_cri_log(text) == "GPU 0: NVIDIA A100 (UUID: GPU-aaaa)\nwarning: slow\n\n"


def test_image_references_split_as_a_mirror_sees_them() -> None:
    ref = ImageRef.parse("nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04")
    assert (ref.registry, ref.repository, ref.tag) == (
        "nvcr.io",
        "nvidia/cuda",
        "12.4.1-base-ubuntu22.04",
    )
    assert served_namespaces() == ("nvcr.io", "registry.k8s.io")


def test_an_image_is_deterministic_and_its_manifest_names_its_blobs() -> None:
    files = {"usr/lib/x86_64-linux-gnu/libc.so.6": b"\x7fELF libc", "usr/bin/dash": b"\x7fELF"}
    image = _build_image(files, {"Cmd": ["/bin/sh"]}, links={"usr/bin/sh": "dash"})
    again = _build_image(files, {"Cmd": ["/bin/sh"]}, links={"usr/bin/sh": "dash"})
    assert image == again, "the same digests at every lab up"
    manifest = json.loads(image.manifest)
    assert manifest["layers"][0]["digest"] == "sha256:" + hashlib.sha256(image.layer).hexdigest()
    assert manifest["config"]["digest"] == "sha256:" + hashlib.sha256(image.config).hexdigest()
    tar = gzip.decompress(image.layer)
    config = json.loads(image.config)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(tar).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert members["usr/bin/sh"].linkname == "dash" and members["bin"].linkname == "usr/bin"
    assert members["usr/lib64/ld-linux-x86-64.so.2"].issym()
    assert members["tmp"].mode == 0o1777 and all(m.mtime == 0 for m in members.values())


def runtime() -> ModuleType:
    return import_lab_script("nvidia-container-runtime", "lab_nvidia_runtime")


def test_runtime_finds_the_bundle_of_create_only() -> None:
    bundle_of = runtime().bundle_of
    create = ["--root", "/run/runc", "--log", "x/log.json", "create", "--bundle", "/b", "id"]
    assert bundle_of(create) == "/b"
    assert bundle_of(["--root", "/r", "create", "--bundle=/c", "id"]) == "/c"
    assert bundle_of(["--root", "/r", "start", "id"]) is None
    assert bundle_of(["--root", "/r", "delete", "--force", "id"]) is None


def test_runtime_adds_the_tools_only_for_a_container_given_gpus(tmp_path: Path) -> None:
    module = runtime()
    given: dict[str, Any] = {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-a"]}}
    assert module.visible_devices(given) == "GPU-a"
    module.add_tools(given)
    destinations = {m["destination"] for m in given["mounts"]}
    assert {"/usr/bin/nvidia-smi", "/usr/bin/python3", "/etc/rollout-lab"} <= destinations
    assert all("ro" in m["options"] for m in given["mounts"])
    assert module.visible_devices({"process": {"env": ["PATH=/bin"]}}) is None


def test_runtime_drops_only_the_limits_of_missing_controllers(tmp_path: Path) -> None:
    module = runtime()
    controllers = tmp_path / "cgroup.controllers"
    module.CONTROLLERS_FILE = str(controllers)
    resources_ = {
        "devices": [{"allow": False, "access": "rwm"}],
        "cpu": {"shares": 2, "cpus": "0-1"},
        "memory": {"limit": 1 << 30},
        "pids": {"limit": 100},
    }
    spec = {"linux": {"resources": json.loads(json.dumps(resources_))}}
    controllers.write_text("cpuset memory\n")
    module.drop_missing_controllers(spec)
    assert spec["linux"]["resources"] == {
        "devices": resources_["devices"],
        "cpu": {"cpus": "0-1"},
        "memory": {"limit": 1 << 30},
    }
    controllers.write_text("")
    module.drop_missing_controllers(spec)
    assert spec["linux"]["resources"] == {"devices": resources_["devices"]}
    everything = {"linux": {"resources": json.loads(json.dumps(resources_))}}
    controllers.write_text("cpu cpuset memory pids io hugetlb rdma\n")
    module.drop_missing_controllers(everything)
    assert everything["linux"]["resources"] == resources_


def test_runtime_raises_the_oom_score_adj_only_without_cap_sys_resource(tmp_path: Path) -> None:
    module = runtime()
    module.OOM_SCORE_ADJ_FILE = str(tmp_path / "oom_score_adj")
    module.STATUS_FILE = str(tmp_path / "status")
    (tmp_path / "oom_score_adj").write_text("0\n")
    without = "CapEff:\t00000080fcecbfff\n"  # a lab node's containerd: no CAP_SYS_RESOURCE
    (tmp_path / "status").write_text(f"Name:\trunc\n{without}")
    sandbox: dict[str, Any] = {"process": {"oomScoreAdj": -998}}
    module.restrict_oom_score_adj(sandbox)
    assert sandbox["process"]["oomScoreAdj"] == 0
    higher: dict[str, Any] = {"process": {"oomScoreAdj": 1000}}
    module.restrict_oom_score_adj(higher)
    assert higher["process"]["oomScoreAdj"] == 1000
    (tmp_path / "status").write_text("CapEff:\t000001ffffffffff\n")
    kept: dict[str, Any] = {"process": {"oomScoreAdj": -998}}
    module.restrict_oom_score_adj(kept)
    assert kept["process"]["oomScoreAdj"] == -998


def test_runtime_gives_a_job_pod_its_own_host_name_in_the_node_s_network() -> None:
    module = runtime()
    node_network: dict[str, Any] = {
        "process": {"env": ["PATH=/bin", "ROLLOUT_LAB_POD_HOSTNAME=rollout-x-1-abcde"]},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]},
    }
    module.give_own_hostname(node_network)
    assert {"type": "uts"} in node_network["linux"]["namespaces"]
    assert node_network["hostname"] == "rollout-x-1-abcde"
    plain: dict[str, Any] = {"process": {"env": ["PATH=/bin"]}, "linux": {"namespaces": []}}
    module.give_own_hostname(plain)
    assert plain == {"process": {"env": ["PATH=/bin"]}, "linux": {"namespaces": []}}
    # containerd joins a container to its sandbox's UTS namespace (in the node's network,
    # the node's): it gets one of its own instead
    sandbox_s = {"type": "uts", "path": "/proc/1/ns/uts"}
    joined: dict[str, Any] = {
        "process": {"env": ["ROLLOUT_LAB_POD_HOSTNAME=p"]},
        "linux": {"namespaces": [{"type": "pid"}, sandbox_s]},
    }
    module.give_own_hostname(joined)
    assert joined["linux"]["namespaces"] == [{"type": "pid"}, {"type": "uts"}]
    assert joined["hostname"] == "p"
