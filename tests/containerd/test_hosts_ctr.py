"""The hosts.toml a plan writes, read by the real containerd 2.1 resolver (`ctr`).

`config dump` does not read hosts.toml: containerd reads it when it resolves an image. `ctr
content fetch-object --hosts-dir` runs that same resolver in the client, with no daemon, so
two stub registries on loopback see which host containerd asks, in which order, and with
which headers.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.changes.containerd.writes import plan_node_containerd
from rollout.facts import load_recorded_facts
from rollout.spec.plan import parse_spec
from tests.conftest import containerd_binary, require
from tests.examples import FACTS

NAMESPACE = "registry.test"
MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": "sha256:" + "0" * 64,
            "size": 2,
        },
        "layers": [],
    }
).encode()


class StubRegistry:
    """Answers manifest requests (or 404s all of them), logging each into a shared list."""

    def __init__(self, name: str, log: list[tuple[str, str, str | None]], serves: bool) -> None:
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                stub.reply(self, body=False)

            def do_GET(self) -> None:
                stub.reply(self, body=True)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.name, self.log, self.serves = name, log, serves
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def reply(self, request: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        self.log.append((self.name, request.command, request.headers.get("X-Team")))
        if not self.serves or "/manifests/" not in request.path:
            request.send_response(404)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        request.send_response(200)
        request.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        request.send_header(
            "Docker-Content-Digest", "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
        )
        request.send_header("Content-Length", str(len(MANIFEST)))
        request.end_headers()
        if body:
            request.wfile.write(MANIFEST)


@pytest.fixture
def ctr() -> Path:
    binary = containerd_binary("2.1").parent / "ctr"
    if not binary.is_file():
        require(f"ctr not found beside {binary.parent}/containerd; run scripts/fetch-containerd")
    return binary


@pytest.fixture
def registries() -> Iterator[tuple[StubRegistry, StubRegistry, list[tuple[str, str, str | None]]]]:
    log: list[tuple[str, str, str | None]] = []
    mirror = StubRegistry("mirror", log, serves=False)
    upstream = StubRegistry("upstream", log, serves=True)
    yield mirror, upstream, log
    mirror.server.shutdown()
    upstream.server.shutdown()


def planned_hosts_toml(tmp_path: Path, node_file: str, mirror: str) -> str:
    """The hosts.toml the plan writes over `node_file` on a containerd 2.1 node (its real text:
    plan output redacts the headers)."""
    facts = tmp_path / "facts"
    shutil.copytree(FACTS / "gpu-b-1", facts / "gpu-b-1")
    path = facts / "gpu-b-1/files/etc/containerd/certs.d" / NAMESPACE / "hosts.toml"
    path.parent.mkdir(parents=True)
    path.write_text(node_file)
    spec = parse_spec(
        "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: mirror}\n"
        "targets: {selector: nvidia.com/gpu.present=true}\n"
        f"changes:\n  - registry:\n      host: {NAMESPACE}\n"
        f"      endpoints:\n        - url: {mirror}\n",
        "plan.yaml",
    )
    [node] = load_recorded_facts(facts).nodes
    writes = plan_node_containerd(spec, node).files
    [after] = [w.after for w in writes if w.path.endswith("/hosts.toml")]
    assert after is not None
    return after


def test_real_containerd_resolves_through_the_planned_mirror_then_the_kept_server(
    tmp_path: Path,
    ctr: Path,
    registries: tuple[StubRegistry, StubRegistry, list[tuple[str, str, str | None]]],
) -> None:
    mirror, upstream, log = registries
    # the node's file: its own server, and a header on the mirror it already lists
    node_file = (
        f'server = "{upstream.url}"\n\n'
        f'[host."{mirror.url}"]\n  capabilities = ["pull"]\n'
        f'  [host."{mirror.url}".header]\n    X-Team = "gpu"\n'
    )
    planned = planned_hosts_toml(tmp_path, node_file, mirror.url)
    hosts_dir = tmp_path / "certs.d"
    (hosts_dir / NAMESPACE).mkdir(parents=True)
    (hosts_dir / NAMESPACE / "hosts.toml").write_text(planned)
    result = subprocess.run(
        [
            str(ctr),
            "content",
            "fetch-object",
            "--hosts-dir",
            str(hosts_dir),
            f"{NAMESPACE}/lib/img:1.0",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout == MANIFEST
    # containerd asked the planned mirror first (with the node's header kept) and, when the
    # mirror had nothing, the server the node already had: the plan did not replace it
    assert log[:2] == [("mirror", "HEAD", "gpu"), ("upstream", "HEAD", None)]
