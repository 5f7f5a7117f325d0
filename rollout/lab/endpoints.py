"""SSH endpoints: many lightweight nodes served by the lab's few real ones (`lab up --endpoints N`).

An endpoint has its own name, loopback address, known_hosts entry, inventory entry and Node
object in the API, and stands for one lab node: an extra sshd inside that node listens on
the endpoint's address, so `plan -i` opens a real SSH session per endpoint and reads the
node's real files, containerd and nvidia-smi. The endpoint's Node object mirrors its node's
labels and status (rollout.lab.simulation.endpointnodes). Endpoints are for planning and
measuring fact gathering at fleet scale (bench/endpoints.py); apply nothing to them.

OpenSSH's sshd listens on at most 16 addresses (MAX_LISTEN_SOCKS in sshd.c), so a node
runs one sshd per 16 of its endpoints, each a unit of the template written here.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from pathlib import Path

from rollout.errors import BadInput
from rollout.lab.description import EndpointDescription

DEFAULT_ENDPOINT_PREFIX = "127.20"
MAX_ENDPOINTS = 10_000
# sshd.c's MAX_LISTEN_SOCKS
LISTEN_PER_SSHD = 16
# Per /24 the endpoints take .1 to .250, as the nodes do.
HOSTS_PER_24 = 250
UNIT = "rollout-lab-endpoints@.service"
READY_TIMEOUT_S = 120.0
POLL_S = 0.5

UNIT_TEXT = """\
[Unit]
Description=rollout lab SSH endpoints, group %i
After=network.target ssh.service

[Service]
ExecStart=/usr/sbin/sshd -D -f /etc/ssh/rollout-lab-endpoints-%i.conf
RuntimeDirectory=sshd
RuntimeDirectoryPreserve=yes
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def plan_endpoints(
    count: int, prefix: str, nodes: Sequence[str]
) -> tuple[EndpointDescription, ...]:
    """N endpoints named lab-ep-0001..., addressed in `prefix`, dealt over the nodes in turn.

    A prefix of two octets (127.20) is a /16: .0.1 to .0.250, then .1.1, ...; one of three
    octets (127.0.85) is a /24 and holds at most 250 endpoints.
    """
    if count < 0 or count > MAX_ENDPOINTS:
        raise BadInput(f"--endpoints must be between 0 and {MAX_ENDPOINTS}, not {count}")
    octets = prefix.split(".")
    if (
        len(octets) not in (2, 3)
        or octets[0] != "127"
        or not all(o.isdigit() and int(o) < 256 for o in octets)
    ):
        raise BadInput(
            "the endpoint prefix must be two or three loopback octets like 127.20 or "
            f"127.0.85, not {prefix!r}"
        )
    room = HOSTS_PER_24 * (256 if len(octets) == 2 else 1)
    if count > room:
        raise BadInput(f"--endpoint-prefix {prefix} holds {room} endpoints, not {count}")
    width = max(4, len(str(count)))
    return tuple(
        EndpointDescription(
            name=f"lab-ep-{i + 1:0{width}d}",
            address=_address(prefix, len(octets), i),
            node=nodes[i % len(nodes)],
        )
        for i in range(count)
    )


def _address(prefix: str, octets: int, index: int) -> str:
    if octets == 3:
        return f"{prefix}.{index + 1}"
    return f"{prefix}.{index // HOSTS_PER_24}.{index % HOSTS_PER_24 + 1}"


def sshd_config_text(group: int, addresses: Sequence[str]) -> str:
    """One endpoint sshd's config: the lab's settings and host key, its own addresses."""
    listen = "".join(f"ListenAddress {a}\n" for a in addresses)
    return (
        f"# rollout lab endpoints, group {group}: this node's files under other addresses\n"
        "Include /etc/ssh/sshd_config.d/50-rollout-lab.conf\n"
        # no PAM session (logind) per connection: an endpoint is a lightweight stand-in
        "UsePAM no\n"
        # a whole fleet's probes arrive at once: queue them rather than drop them
        "MaxStartups 512\n"
        f"PidFile /run/rollout-lab-endpoints-{group}.pid\n"
        f"{listen}"
    )


def write_endpoint_sshds(root: Path, addresses: Sequence[str]) -> None:
    """Write the node's endpoint sshd configs and their enabled units (before it boots)."""
    etc = root / "etc"
    unit = etc / "systemd" / "system" / UNIT
    wants = etc / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (etc / "ssh").mkdir(parents=True, exist_ok=True)
    unit.write_text(UNIT_TEXT)
    for group, start in enumerate(range(0, len(addresses), LISTEN_PER_SSHD)):
        chunk = addresses[start : start + LISTEN_PER_SSHD]
        (etc / "ssh" / f"rollout-lab-endpoints-{group}.conf").write_text(
            sshd_config_text(group, chunk)
        )
        link = wants / UNIT.replace("@", f"@{group}")
        link.unlink(missing_ok=True)
        link.symlink_to(f"/etc/systemd/system/{UNIT}")


def endpoints_not_listening(
    endpoints: Sequence[EndpointDescription], timeout_s: float = READY_TIMEOUT_S
) -> list[EndpointDescription]:
    """Wait until every endpoint's sshd accepts connections; those still closed at the end."""
    deadline = time.monotonic() + timeout_s
    waiting = list(endpoints)
    while waiting and time.monotonic() < deadline:
        waiting = [e for e in waiting if not _listening(e.address)]
        if waiting:
            time.sleep(POLL_S)
    return waiting


def _listening(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=1.0):
            return True
    except OSError:
        return False
