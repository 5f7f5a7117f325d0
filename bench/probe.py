"""Where the time of a live probe goes: the SSH handshake, one round trip per fact, one batch.

    .venv/bin/python bench/probe.py --inventory LAB/inventory.yaml [--runs 5]

Against the nodes of an inventory (the lab's, as bench/run brings it up), each run measures:
- `handshake_s`: paramiko/fabric connecting and authenticating (SshRunner.open), all nodes
  in parallel, and the slowest node alone (`handshake_node_s`);
- `per_fact_s`: the five facts `rollout plan` reads, one SSH exec each, on the open
  connections, nodes in parallel (how rollout probed before facts.batch);
- `batched_s`: the same facts in one exec per node (rollout.facts.batch.read_facts);
- `openssh_s`: the floor, one OpenSSH process per node running the same commands in one
  `sh` (a fresh connection each, ControlMaster off), nodes in parallel.
Medians over the runs; each run opens fresh connections. Prints JSON. Never a timed test.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.fact import read_fact  # noqa: E402
from rollout.facts.batch import batch_script, read_facts  # noqa: E402
from rollout.facts.containerd import (  # noqa: E402
    ConfigDumpFact,
    ConfigFilesFact,
    ContainerdVersionFact,
)
from rollout.facts.gpu import GpuQueryFact  # noqa: E402
from rollout.facts.service import ServiceFact  # noqa: E402
from rollout.inventory import load_inventory  # noqa: E402
from rollout.transports.ssh import SshOptions, SshRunner  # noqa: E402


def facts() -> tuple[Any, ...]:
    return (
        ContainerdVersionFact(),
        ConfigFilesFact(),
        GpuQueryFact(),
        ServiceFact(),
        ConfigDumpFact(),
    )


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def in_parallel(items: list[Any], work: Callable[[Any], object]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        for _ in pool.map(work, items):
            pass


def openssh_argv(host: Any, script: str) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none"]
    if host.key_file:
        argv += ["-i", host.key_file]
    if host.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={host.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    argv += ["-p", str(host.port), f"{host.user}@{host.address}", shlex.join(["sh", "-c", script])]
    return argv


def one_run(inventory: Path) -> dict[str, float]:
    hosts = list(load_inventory(inventory).hosts)
    runners = [SshRunner(h, SshOptions()) for h in hosts]
    try:
        handshake = timed(lambda: in_parallel(runners, lambda r: r.open()))
        for runner in runners:
            runner.close()
        handshake_node = max(timed(r.open) for r in runners)
        per_fact = timed(lambda: in_parallel(runners, lambda r: [read_fact(r, f) for f in facts()]))
        batched = timed(lambda: in_parallel(runners, lambda r: read_facts(r, facts())))
    finally:
        for runner in runners:
            runner.close()
    script = batch_script(facts(), "rollout-fact-bench")

    def openssh(host: Any) -> None:
        subprocess.run(openssh_argv(host, script), check=True, capture_output=True)

    floor = timed(lambda: in_parallel(hosts, openssh))
    return {
        "handshake_s": handshake,
        "handshake_node_s": handshake_node,
        "per_fact_s": per_fact,
        "batched_s": batched,
        "openssh_s": floor,
    }


def measure_probe(inventory: Path, runs: int) -> dict[str, Any]:
    samples = [one_run(inventory) for _ in range(runs)]
    result: dict[str, Any] = {"runs": runs, "nodes": len(load_inventory(inventory).hosts)}
    for key in samples[0]:
        result[key] = round(statistics.median(s[key] for s in samples), 4)
    result["paramiko_first_probe_s"] = round(result["handshake_s"] + result["batched_s"], 4)
    result["vs_openssh"] = round(result["paramiko_first_probe_s"] / result["openssh_s"], 2)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure_probe(args.inventory, args.runs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
