"""The kubelet's pod status writers: phase, conditions and container statuses as a real
kubelet reports them for a pod that waits, runs, crash-loops, completes or is refused."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from rollout.lab.apiserver.metadata import format_timestamp


def _condition(
    kind: str, status: bool, now: float, reason: str = "", message: str = ""
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": format_timestamp(now),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _set_conditions(pod: dict[str, Any], conditions: list[dict[str, Any]]) -> None:
    """Replace conditions, keeping transition times of those whose status did not change."""
    status = pod.setdefault("status", {})
    previous = {c.get("type"): c for c in status.get("conditions") or []}
    for condition in conditions:
        old = previous.get(condition["type"])
        if old is not None and old.get("status") == condition["status"]:
            condition["lastTransitionTime"] = old.get("lastTransitionTime")
    scheduled = previous.get("PodScheduled")
    status["conditions"] = [*conditions, *([scheduled] if scheduled else [])]


def _image_id(image: str) -> str:
    return f"{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _container_id(pod: Mapping[str, Any], name: str, restarts: int) -> str:
    seed = f"{pod['metadata']['uid']}/{name}/{restarts}".encode()
    return f"containerd://{hashlib.sha256(seed).hexdigest()}"


def _containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"].get("containers") or [])


def _set_containers_not_ready(pod: dict[str, Any], sandbox_ready: bool, now: float) -> None:
    """Conditions of an initialized pod whose containers are not (or no longer) ready."""
    names = [c["name"] for c in _containers(pod)]
    unready = f"containers with unready status: [{' '.join(names)}]"
    _set_conditions(
        pod,
        [
            _condition("PodReadyToStartContainers", sandbox_ready, now),
            _condition("Initialized", True, now),
            _condition("Ready", False, now, "ContainersNotReady", unready),
            _condition("ContainersReady", False, now, "ContainersNotReady", unready),
        ],
    )


def set_waiting(pod: dict[str, Any], reason: str, message: str, now: float) -> None:
    """Containers not created yet (no sandbox), waiting for `reason`."""
    _set_containers_not_ready(pod, False, now)
    waiting: dict[str, Any] = {"reason": reason}
    if message:
        waiting["message"] = message
    pod["status"]["hostIP"] = pod["status"].get("hostIP")
    pod["status"]["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {"waiting": waiting},
        }
        for c in _containers(pod)
    ]
    pod["status"].setdefault("startTime", format_timestamp(now))


def set_running(
    pod: dict[str, Any], host_ip: str, pod_ip: str | None, now: float, *, restart: bool = False
) -> None:
    """Running and ready; a restarted container keeps its restart count and last state
    (`restart`: started again after its node rebooted, one restart more)."""
    status = pod.setdefault("status", {})
    status["phase"] = "Running"
    status["hostIP"] = host_ip
    status["hostIPs"] = [{"ip": host_ip}]
    if pod_ip is not None:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    status.setdefault("startTime", format_timestamp(now))
    _set_conditions(
        pod,
        [
            _condition("PodReadyToStartContainers", True, now),
            _condition("Initialized", True, now),
            _condition("Ready", True, now),
            _condition("ContainersReady", True, now),
        ],
    )
    previous = {s.get("name"): s for s in status.get("containerStatuses") or []}
    statuses = []
    for container in _containers(pod):
        restarts = int((previous.get(container["name"]) or {}).get("restartCount", 0))
        restarts += 1 if restart else 0
        entry: dict[str, Any] = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": _image_id(str(container.get("image", ""))),
            "containerID": _container_id(pod, container["name"], restarts),
            "ready": True,
            "started": True,
            "restartCount": restarts,
            "state": {"running": {"startedAt": format_timestamp(now)}},
        }
        last = (previous.get(container["name"]) or {}).get("lastState")
        if last:
            entry["lastState"] = last
        statuses.append(entry)
    status["containerStatuses"] = statuses


def set_crash_loop(pod: dict[str, Any], now: float, backoff_s: float = 10.0) -> None:
    """Every container exited with an error and waits in CrashLoopBackOff, one restart more,
    for `backoff_s` (the kubelet's back-off: 10 s, doubled at each restart, 5 min at most)."""
    status = pod["status"]
    _set_containers_not_ready(pod, True, now)
    statuses = []
    for entry in status.get("containerStatuses") or []:
        restarts = int(entry.get("restartCount", 0)) + 1
        statuses.append(
            {
                **entry,
                "ready": False,
                "started": False,
                "restartCount": restarts,
                "lastState": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "finishedAt": format_timestamp(now),
                        "containerID": entry.get("containerID", ""),
                    }
                },
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {_duration(backoff_s)} restarting failed "
                        f"container={entry['name']} "
                        f"pod={pod['metadata']['name']}_{pod['metadata']['namespace']}"
                        f"({pod['metadata']['uid']})",
                    }
                },
            }
        )
    status["containerStatuses"] = statuses


def set_create_error(pod: dict[str, Any], reason: str, message: str, now: float) -> None:
    """Containers not running and waiting for `reason` (ContainerCreating while the sandbox
    cannot be made, CreateContainerError); restart counts and last states are kept."""
    status = pod.setdefault("status", {})
    _set_containers_not_ready(pod, reason != "ContainerCreating", now)
    previous = {s.get("name"): s for s in status.get("containerStatuses") or []}
    waiting: dict[str, Any] = {"reason": reason}
    if message:
        waiting["message"] = message
    statuses = []
    for container in _containers(pod):
        old = previous.get(container["name"]) or {}
        entry = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": old.get("imageID", ""),
            "ready": False,
            "restartCount": int(old.get("restartCount", 0)),
            "started": False,
            "state": {"waiting": waiting},
        }
        if old.get("lastState"):
            entry["lastState"] = old["lastState"]
        statuses.append(entry)
    status["containerStatuses"] = statuses


def _duration(seconds: float) -> str:
    """A Go time.Duration as the kubelet prints it: 10s, 2m40s, 5m0s."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:g}s" if seconds < 1 else f"{whole}s"
    return f"{whole // 60}m{whole % 60}s"


def set_succeeded(pod: dict[str, Any], now: float) -> None:
    """Completed: every container terminated with exit code 0."""
    set_terminated(pod, now, 0)


def set_terminated(pod: dict[str, Any], now: float, exit_code: int) -> None:
    """Every container terminated with `exit_code`: Succeeded for 0, Failed (Error) else."""
    status = pod["status"]
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    _set_conditions(
        pod,
        [
            _condition("PodReadyToStartContainers", False, now),
            _condition("Initialized", True, now, "PodCompleted"),
            _condition("Ready", False, now, "PodCompleted"),
            _condition("ContainersReady", False, now, "PodCompleted"),
        ],
    )
    statuses = []
    for entry in status.get("containerStatuses") or []:
        started = ((entry.get("state") or {}).get("running") or {}).get("startedAt")
        statuses.append(
            {
                **entry,
                "ready": False,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if exit_code == 0 else "Error",
                        "startedAt": started,
                        "finishedAt": format_timestamp(now),
                        "containerID": entry.get("containerID", ""),
                    }
                },
            }
        )
    status["containerStatuses"] = statuses


def set_failed(pod: dict[str, Any], reason: str, message: str) -> None:
    """Refused by the kubelet (admission): phase Failed with its reason."""
    status = pod["status"]
    status["phase"] = "Failed"
    status["reason"] = reason
    status["message"] = message


def waiting_reason(pod: Mapping[str, Any]) -> str | None:
    """Why the first waiting container waits, or None."""
    for entry in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (entry.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason"))
    return None
