"""The official client against an API a test module serves: it defines `api_url`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client


@pytest.fixture()
def api(api_url: str) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=api_url)) as api_client:
        yield api_client


@pytest.fixture()
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)
