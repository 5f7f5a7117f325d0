"""Kubeconfig files for tests that reach an API emulator as a user would: through a file."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def write_kubeconfig(
    path: Path,
    server: str,
    *,
    context: str = "lab",
    token: str | None = None,
    ca_pem: bytes | None = None,
    namespace: str | None = None,
) -> Path:
    """A kubeconfig of one cluster, user and context, that context current; the user has
    `token` (or no credential), the cluster `ca_pem` as its CA (or none: plain http)."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    chosen = {"cluster": context, "user": context}
    if namespace is not None:
        chosen["namespace"] = namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": {} if token is None else {"token": token}}],
        "contexts": [{"name": context, "context": chosen}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(document))
    return path
