"""Where the client's configuration comes from: a kubeconfig as kubectl finds it, the pod's
service account, or a bare URL; always with urllib3's own retries off."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from rollout.transports.errors import KubeConfigError
from rollout.transports.kube.incluster import (
    DEFAULT_KUBECONFIG,
    KUBECONFIG_ENV,
    in_cluster_configuration,
    pod_service_account,
)


def load_kubeconfig(path: str | None = None, context: str | None = None) -> k8s.Configuration:
    """Like kubectl: `path`, else $KUBECONFIG (a ':' list), else ~/.kube/config; in a pod
    with none of them, the pod's service account."""
    account = pod_service_account(path, context)
    if account is not None:
        return _without_retries(in_cluster_configuration(account))
    chosen = path or os.environ.get(KUBECONFIG_ENV) or DEFAULT_KUBECONFIG
    files = [Path(p).expanduser() for p in chosen.split(os.pathsep) if p]
    where = f"kubeconfig {chosen}"
    if not any(f.is_file() for f in files):
        missing = not any(f.exists() for f in files)
        message = "no such file" if missing else "not a regular file (a kubeconfig is a file)"
        raise KubeConfigError("load", where, message=message)
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.pathsep.join(str(f) for f in files),
            context=context,
            client_configuration=configuration,
        )
    except ConfigException as exc:
        target = f"{where} (context {context})" if context else where
        names = _context_names(os.pathsep.join(str(f) for f in files)) if context else None
        if names is not None and context not in names:
            raise KubeConfigError("load", where, message=_no_such_context(context, names)) from exc
        raise KubeConfigError("load", target, message=str(exc)) from exc
    return _without_retries(configuration)


# the contexts an unknown --context lists; a kubeconfig may hold hundreds
LISTED_CONTEXTS = 20


def _context_names(config_file: str) -> list[str] | None:
    """The contexts of the kubeconfig(s), or None where it cannot even list them."""
    try:
        contexts, _ = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=config_file
        )
    except (ConfigException, TypeError, KeyError, AttributeError):
        return None
    return [str(c.get("name")) for c in contexts or () if isinstance(c, dict)]


def _no_such_context(context: str | None, names: list[str]) -> str:
    if not names:
        return f"no context {context!r}: the kubeconfig has no contexts"
    listed = ", ".join(names[:LISTED_CONTEXTS])
    more = f" and {len(names) - LISTED_CONTEXTS} more" if len(names) > LISTED_CONTEXTS else ""
    return f"no context {context!r}; its contexts: {listed}{more}"


# at least the executor's node threads (rollout.executor.MAX_PARALLEL), the lease's and a few
API_CONNECTIONS = 64


def url_configuration(url: str) -> k8s.Configuration:
    """No credentials, only the server's URL (the lab's API emulator, tests)."""
    configuration = k8s.Configuration()
    configuration.host = url
    return _without_retries(configuration)


def _without_retries(configuration: k8s.Configuration) -> k8s.Configuration:
    # urllib3 would otherwise retry connection errors on its own, hidden from rollout.retry,
    # the one place retries live.
    configuration.retries = False
    # The nodes of a wave call the API from their own threads (rollout.executor) on this one
    # client: keep a connection for each, where urllib3 would keep 10 and log a warning for
    # every connection it drops past them.
    configuration.connection_pool_maxsize = API_CONNECTIONS
    return configuration
