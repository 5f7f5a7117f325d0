"""A Secret as rollout keeps one: its run in the cluster (rollout/run/cluster.py)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.transports.kube.objects import ConfigMap


@dataclass(frozen=True)
class Secret(ConfigMap):
    """An Opaque Secret of text values: a ConfigMap's data, sent base64, and readable only by
    those granted secrets (not the built-in view role)."""

    def to_json(self) -> dict[str, Any]:
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in self.data.items()}
        return {**super().to_json(), "kind": "Secret", "type": "Opaque", "data": encoded}

    @staticmethod
    def decode_data(data: Mapping[str, Any]) -> Mapping[str, Any]:
        return {k: base64.b64decode(str(v)).decode() for k, v in data.items()}
