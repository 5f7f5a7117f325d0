"""PodDisruptionBudgets for tests. KubeClient only reads them (rollout never writes one), so a
test makes them through the official client, on the server its KubeClient talks to."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from rollout.transports.kube import KubeClient


def create_pod_budget(
    kube: KubeClient, namespace: str, name: str, app: str, min_available: int = 1
) -> None:
    """Budget `name`: at least `min_available` of the pods labelled app=`app` stay up."""
    selector = {"matchLabels": {"app": app}}
    _policy_api(kube).create_namespaced_pod_disruption_budget(
        namespace,
        {"metadata": {"name": name}, "spec": {"minAvailable": min_available, "selector": selector}},
    )


def delete_pod_budget(kube: KubeClient, namespace: str, name: str) -> None:
    _policy_api(kube).delete_namespaced_pod_disruption_budget(name, namespace)


def _policy_api(kube: KubeClient) -> Any:
    return client.PolicyV1Api(client.ApiClient(client.Configuration(host=kube.server)))
