"""Real kubectl 1.36 writes built-in kinds as protobuf; the emulator reads every one it serves
into the object the same manifest as JSON gives. The commands are the ones `rollout schedule`
tells a user to run, with kubectl's default flags, each with kubectl's time limit."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rollout.lab.apiserver import Registry
from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.protobuf import decode_object
from rollout.lab.apiserver.resources import (
    CONFIGMAPS,
    CRONJOBS,
    DAEMONSETS,
    JOBS,
    PODDISRUPTIONBUDGETS,
    SECRETS,
)
from tests.lab.test_kubectl import (  # noqa: F401 (fixtures)
    Kubectl,
    kubectl,
    registry,
)
from tests.lab.test_schedule import rollout_schedule  # noqa: F401 (fixture)


def header_commands(manifests: str) -> list[str]:
    """The kubectl command the schedule's header comment tells the user to run."""
    lines = [line.removeprefix("#").strip() for line in manifests.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("kubectl create secret"))
    first = lines[start].removesuffix("\\").strip()
    return f"{first} {lines[start + 1]}".split()


def test_the_schedule_secret_and_a_job_from_its_cronjob(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
    rollout_schedule: Callable[..., str],  # noqa: F811
    tmp_path: Path,
) -> None:
    kubectl("create", "namespace", "gpu-operator")
    manifests = rollout_schedule()
    kubectl("apply", "-f", "-", stdin=manifests)
    (cronjob,) = registry.list_objects(CRONJOBS, "rollout")
    name = cronjob["metadata"]["name"]
    key, known_hosts = tmp_path / "id_ed25519", tmp_path / "known_hosts"
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n")
    known_hosts.write_bytes(b"127.0.61.2 ssh-ed25519 AAAAC3Nza\n")
    command = header_commands(manifests)
    argv = [
        arg.replace("PATH/TO/KEY", str(key)).replace("PATH/TO/known_hosts", str(known_hosts))
        for arg in command[1:]
    ]
    secret_name = argv[3]
    assert kubectl(*argv).stdout == f"secret/{secret_name} created\n"
    secret = registry.get(SECRETS, "rollout", secret_name)
    assert secret["type"] == "Opaque"
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {
        "ssh-privatekey": key.read_bytes(),
        "known_hosts": known_hosts.read_bytes(),
    }
    created = kubectl("create", "job", "by-hand", f"--from=cronjob/{name}", "-n", "rollout")
    assert created.stdout == "job.batch/by-hand created\n"
    job = registry.get(JOBS, "rollout", "by-hand")
    # the CronJob's template, whole: volumes inlined as JSON has them, env, resources
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod_spec = job["spec"]["template"]["spec"]
    for field in ("volumes", "serviceAccountName", "restartPolicy"):
        assert pod_spec[field] == template[field], field
    for field in ("image", "args", "env", "volumeMounts", "resources"):
        assert pod_spec["containers"][0].get(field) == template["containers"][0].get(field)
    assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    assert job["metadata"]["ownerReferences"][0]["name"] == name


def test_create_configmap_and_apply_new_objects(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    (tmp_path / "config.yaml").write_text("version: v1\nsharing: {}\n")
    kubectl("create", "configmap", "slicing", f"--from-file={tmp_path / 'config.yaml'}")
    assert registry.get(CONFIGMAPS, "default", "slicing")["data"] == {
        "config.yaml": "version: v1\nsharing: {}\n"
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "plugin", "labels": {"app": "plugin"}},
        "spec": {
            "selector": {"matchLabels": {"app": "plugin"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": {"app": "plugin"}},
                "spec": {
                    "tolerations": [{"operator": "Exists", "tolerationSeconds": 30}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:1.36",
                            "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}},
                            "securityContext": {"runAsUser": 0, "privileged": True},
                        }
                    ],
                    "volumes": [{"name": "root", "hostPath": {"path": "/", "type": ""}}],
                },
            },
        },
    }
    said = kubectl("create", "-f", "-", stdin=yaml.safe_dump(daemonset)).stdout
    assert said == "daemonset.apps/plugin created\n"
    stored = registry.get(DAEMONSETS, "default", "plugin")
    assert stored["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "25%"
    pod_spec = stored["spec"]["template"]["spec"]
    assert pod_spec["volumes"] == [{"name": "root", "hostPath": {"path": "/", "type": ""}}]
    assert pod_spec["containers"][0]["resources"] == {"limits": {"cpu": "500m", "memory": "1Gi"}}
    assert pod_spec["containers"][0]["securityContext"] == {"runAsUser": 0, "privileged": True}
    assert pod_spec["tolerations"] == [{"operator": "Exists", "tolerationSeconds": 30}]
    # the imperative generators write protobuf: a Job, a CronJob, a budget, a Deployment-less
    # workload set, each read back as its JSON
    kubectl("create", "job", "once", "--image=busybox:1.36", "--", "true")
    assert registry.get(JOBS, "default", "once")["spec"]["template"]["spec"]["containers"][0][
        "command"
    ] == ["true"]
    kubectl("create", "cronjob", "nightly", "--image=busybox:1.36", "--schedule=0 1 * * *")
    assert registry.get(CRONJOBS, "default", "nightly")["spec"]["schedule"] == "0 1 * * *"
    kubectl("create", "poddisruptionbudget", "one", "--selector=app=plugin", "--min-available=1")
    assert registry.get(PODDISRUPTIONBUDGETS, "default", "one")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": {"app": "plugin"}},
    }
    replaced = kubectl("replace", "-f", "-", stdin=json.dumps(_with_label(stored))).stdout
    assert replaced == "daemonset.apps/plugin replaced\n"
    assert registry.get(DAEMONSETS, "default", "plugin")["metadata"]["labels"]["v"] == "2"


def test_a_custom_resource_in_protobuf_is_refused_with_415() -> None:
    # runtime.Unknown: TypeMeta{apiVersion, kind}, then the raw message
    type_meta = _bytes_field(1, b"nvidia.com/v1") + _bytes_field(2, b"ClusterPolicy")
    body = b"k8s\x00" + _bytes_field(1, type_meta) + _bytes_field(2, b"")
    try:
        decode_object(body)
    except ApiError as error:
        assert (error.code, error.message) == (
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json, application/yaml",
        )
    else:
        raise AssertionError("a ClusterPolicy in protobuf was read")


def _with_label(obj: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["labels"]["v"] = "2"
    return obj


def _bytes_field(number: int, data: bytes) -> bytes:
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data
