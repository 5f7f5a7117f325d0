"""In a pod, with no kubeconfig anywhere, rollout talks to the API as the pod's service
account: https to KUBERNETES_SERVICE_HOST/PORT, the mounted CA, the mounted token. Checked
against the API emulator serving TLS with a fake service-account directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.authentication import LAB_ADMIN, Authenticator
from rollout.lab.apiserver.rbac import ANONYMOUS
from rollout.lab.simulation.podservice import LabCertificate
from rollout.transports.errors import KubeConfigError, KubeError
from rollout.transports.kube import KubeClient, incluster
from tests.lab.test_kubectl import add_node

TOKEN = "pod-service-account-token"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[ApiServer, bytes]]:
    registry = Registry()
    add_node(registry, "gpu-1")
    certificate = LabCertificate.for_address("127.0.0.1")
    authenticator = Authenticator({TOKEN: LAB_ADMIN}, anonymous=ANONYMOUS)
    with ApiServer.start(registry, authenticator=authenticator, tls=certificate.context) as running:
        yield running, certificate.ca_pem


@pytest.fixture()
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: tuple[ApiServer, bytes]) -> Path:
    """The environment of a pod: service host and port, the account's files, no kubeconfig."""
    running, ca_pem = server
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN)
    (account / "ca.crt").write_bytes(ca_pem)
    (account / "namespace").write_text("rollout\n")
    monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", account)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    host, port = running.url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    return account


def test_without_a_kubeconfig_a_pod_uses_its_service_account(pod: Path) -> None:
    kube = KubeClient.from_kubeconfig()
    try:
        assert kube.server.startswith("https://127.0.0.1:")
        assert [n.name for n in kube.list_nodes()] == ["gpu-1"]  # TLS verified, token taken
    finally:
        kube.close()
    account = incluster.find_service_account()
    assert account is not None and account.namespace == "rollout"


def test_the_mounted_token_is_what_the_server_sees(pod: Path) -> None:
    (pod / "token").write_text("someone-else")
    kube = KubeClient.from_kubeconfig()
    try:
        with pytest.raises(KubeError, match=r"Unauthorized|401"):
            kube.list_nodes()
    finally:
        kube.close()


def test_a_missing_token_says_where_it_looked(pod: Path) -> None:
    (pod / "token").unlink()
    with pytest.raises(KubeConfigError, match="token file does not exist") as raised:
        KubeClient.from_kubeconfig()
    assert str(pod) in str(raised.value) and "--kubeconfig" in str(raised.value)


def test_a_named_kubeconfig_is_never_replaced_by_the_pod_account(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "no-such-kubeconfig")
    with pytest.raises(KubeConfigError, match="no such file"):
        KubeClient.from_kubeconfig(missing)
    monkeypatch.setenv("KUBECONFIG", missing)
    with pytest.raises(KubeConfigError, match="no such file"):
        KubeClient.from_kubeconfig()


def test_outside_a_pod_the_missing_kubeconfig_is_the_error(
    pod: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(KubeConfigError, match="no such file"):
        KubeClient.from_kubeconfig()
    assert incluster.find_service_account() is None
