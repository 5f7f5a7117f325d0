"""The pod's own service account, for a run inside the cluster (the scheduled CronJob).

A pod gets `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` in its environment and its
account's token, CA and namespace under SERVICE_ACCOUNT_DIR. rollout uses them when nothing
names a kubeconfig: no --kubeconfig, no $KUBECONFIG, no ~/.kube/config (`pod_service_account`
is that rule; config.py asks it at the one place the kubeconfig is loaded). The token is read again
as the client's loader does, so a projected token that the kubelet rotates keeps working.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader

from rollout.transports.errors import KubeConfigError

# Where kubectl looks for a kubeconfig when no --kubeconfig names one; kept here, beside the
# rule that a pod with none of them uses its service account (config.py imports both).
DEFAULT_KUBECONFIG = "~/.kube/config"
KUBECONFIG_ENV = "KUBECONFIG"

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
HOST_ENV = "KUBERNETES_SERVICE_HOST"
PORT_ENV = "KUBERNETES_SERVICE_PORT"
TOKEN_FILE = "token"
CA_FILE = "ca.crt"
NAMESPACE_FILE = "namespace"


@dataclass(frozen=True)
class ServiceAccount:
    """Where the pod's API server is, and the files of the account it runs as."""

    host: str
    port: str
    directory: Path

    @property
    def namespace(self) -> str | None:
        """The pod's namespace, as the account's directory names it."""
        try:
            return (self.directory / NAMESPACE_FILE).read_text().strip() or None
        except OSError:
            return None


def find_service_account(
    environ: Mapping[str, str] | None = None, directory: Path | None = None
) -> ServiceAccount | None:
    """The pod's account when rollout runs in a pod (the service host and port are set),
    else None."""
    env = os.environ if environ is None else environ
    host, port = env.get(HOST_ENV, ""), env.get(PORT_ENV, "")
    if not host or not port:
        return None
    return ServiceAccount(host, port, directory or SERVICE_ACCOUNT_DIR)


def pod_service_account(
    kubeconfig: str | None, context: str | None, environ: Mapping[str, str] | None = None
) -> ServiceAccount | None:
    """The pod's account when the client will talk as it (config.load_kubeconfig asks here):
    nothing names a kubeconfig or a context and none is at the default path; else None."""
    env = os.environ if environ is None else environ
    if kubeconfig or context or env.get(KUBECONFIG_ENV):
        return None
    if Path(DEFAULT_KUBECONFIG).expanduser().is_file():
        return None
    return find_service_account(env)


def in_cluster_configuration(account: ServiceAccount) -> k8s.Configuration:
    """A client configuration for the account: https to the service, its CA, its token."""
    configuration = k8s.Configuration()
    loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(account.directory / TOKEN_FILE),
        cert_filename=str(account.directory / CA_FILE),
        environ={HOST_ENV: account.host, PORT_ENV: account.port},
    )
    try:
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as exc:
        raise KubeConfigError(
            "load",
            f"in-cluster service account {account.directory}",
            message=f"{exc}; no kubeconfig was given, and {HOST_ENV} is set, so rollout"
            " took the pod's service account (mount its token, or pass --kubeconfig)",
        ) from exc
    return configuration
