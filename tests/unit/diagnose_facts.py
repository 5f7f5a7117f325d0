"""Recorded facts for the diagnose tests: examples/facts (its broken node repaired) + changes."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from rollout.facts import FleetFacts, load_recorded_facts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "facts"
CASES = Path(__file__).resolve().parent / "data" / "diagnose" / "cases.yaml"
# after every ActiveEnterTimestamp of the cases
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SHADOWING_FILE = "/etc/containerd/conf.d/registry.toml"


def load_cases() -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
    data = yaml.safe_load(CASES.read_text())
    return data["defaults"], data["cases"]


def merge_node_yaml(node_dir: Path, changes: Mapping[str, Any]) -> None:
    path = node_dir / "node.yaml"
    doc = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if key in ("labels", "annotations") and isinstance(value, Mapping):
            doc[key] = {**(doc.get(key) or {}), **value}
        else:
            doc[key] = value
    path.write_text(yaml.safe_dump(doc))


def build_facts(
    root: Path,
    *,
    all_nodes: Mapping[str, Any] | None = None,
    node: str | None = None,
    node_yaml: Mapping[str, Any] | None = None,
    files: Mapping[str, str | None] | None = None,
    cluster: Mapping[str, Any] | None = None,
) -> FleetFacts:
    """examples/facts copied into root, gpu-a-3's shadowing drop-in removed, then the changes."""
    shutil.copytree(EXAMPLES, root)
    (root / "gpu-a-3" / "files" / SHADOWING_FILE.lstrip("/")).unlink()
    for node_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        merge_node_yaml(node_dir, all_nodes or {})
    if node is not None:
        merge_node_yaml(root / node, node_yaml or {})
        for path, text in (files or {}).items():
            local = root / node / "files" / path.lstrip("/")
            if text is None:
                local.unlink()
            else:
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(text)
    (root / "cluster.yaml").write_text(yaml.safe_dump(dict(cluster or {})))
    return load_recorded_facts(root)
