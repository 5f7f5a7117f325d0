"""The lab kubelet's CRI client: runs a pod's container through a node's own containerd.

The protocol is Kubernetes' CRI (runtime.v1), compiled from Debian's golang-k8s-cri-api-dev by
scripts/fetch-cri-api into the cache (protocol.py loads it). pods.py runs one container the
way the kubelet does: RunPodSandbox with the pod's runtime handler, PullImage when the image
is absent, CreateContainer, StartContainer, then ContainerStatus until it exits and its log
from the containerd log file; the sandbox goes when the pod is deleted.
"""

from rollout.lab.cri.pods import (
    ContainerRequest,
    CriPodRunner,
    PodOutcome,
    read_cri_log,
)
from rollout.lab.cri.protocol import CriUnavailable, load_protocol

__all__ = [
    "ContainerRequest",
    "CriPodRunner",
    "CriUnavailable",
    "PodOutcome",
    "load_protocol",
    "read_cri_log",
]
