"""Clients of the APIs a lab test module serves: the official client on the `api_url` it
defines, and a KubeClient on the `lab` it defines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from rollout.lab.cluster import Lab
from rollout.transports.kube import KubeClient
from tests.lab.labapi import lab_kube_client


@pytest.fixture()
def api(api_url: str) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=api_url)) as api_client:
        yield api_client


@pytest.fixture()
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture()
def kube(lab: Lab) -> Iterator[KubeClient]:
    """A KubeClient through the module's lab's own kubeconfig (a module that prepares the
    cluster through it defines its own)."""
    with lab_kube_client(lab) as kube:
        yield kube
