"""Issue 23's live planning at fleet scale: `plan -i` on 1,000 SSH endpoints of the lab.

    .venv/bin/python bench/endpoints.py [--endpoints 1000] [--parallel 50] [--nodes 1]
        [--lab-dir DIR] [--address-prefix 127.0.84] [--endpoint-prefix 127.20]
        [--no-ansible] [--json bench/endpoints_results.json]

Brings up a lab with N endpoints (`rollout lab up --endpoints N`: one real node serving
them, each endpoint its own address, host key entry, inventory entry and Node object), then
measures, once each, in this order:
- the OpenSSH floor: one `ssh` process per endpoint, at most --parallel at once, each
  running the five commands of rollout's fact probe in one `sh` (bench/probe.py);
- `rollout plan examples/plan.yaml -i INVENTORY -o json --parallel P`;
- `ansible-playbook --check --diff` of bench/ansible/registry-mirror.yml with forks P
  (ansible-core in a venv of its own under the cache, never in rollout's dependencies).
Writes the figures, the ratios against the targets (rollout at most 1.5x the floor,
Ansible at least 5x slower than rollout) and the load average before and after each to
JSON. A benchmark, not a test: on a shared machine the load average says how much the
figures can be trusted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab_rows import (  # noqa: E402
    PLAYBOOK,
    ansible_inventory,
    ansible_playbook,
    load,
    quiet,
    rollout_plan_argv,
    timed_run,
)
from bench.probe import facts, openssh_argv  # noqa: E402
from rollout.facts.batch import batch_script  # noqa: E402
from rollout.inventory import load_inventory  # noqa: E402
from rollout.lab.cluster import Lab, LabOptions, bring_up_lab, tear_down_lab  # noqa: E402

TARGET_FLOOR_RATIO = 1.5
TARGET_ANSIBLE_RATIO = 5.0
RESULTS = REPO / "bench" / "endpoints_results.json"


def openssh_floor(lab: Lab, parallel: int) -> float:
    """One OpenSSH process per inventory node, at most `parallel` at once, each running the
    fact probe's commands in one sh; the wall seconds of the whole."""
    script = batch_script(facts(), "rollout-fact-floor")
    hosts = list(load_inventory(lab.inventory).hosts)

    def one(host: Any) -> int:
        return subprocess.run(
            openssh_argv(host, script), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ).returncode

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        codes = list(pool.map(one, hosts))
    wall = time.perf_counter() - start
    failed = sum(1 for c in codes if c != 0)
    if failed:
        raise SystemExit(f"the OpenSSH floor failed on {failed} endpoint(s)")
    return wall


def measure_ansible(lab: Lab, parallel: int, scratch: Path) -> dict[str, Any]:
    binary = ansible_playbook()
    inventory = ansible_inventory(lab, scratch / "inventory.ini")
    env = {
        **os.environ,
        "ANSIBLE_FORKS": str(parallel),
        "ANSIBLE_PIPELINING": "true",
        "ANSIBLE_NOCOLOR": "true",
        "ANSIBLE_HOST_KEY_CHECKING": "true",
        "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-tmp"),
    }
    argv = [str(binary), "-i", str(inventory), str(PLAYBOOK), "--check", "--diff"]
    before = load()
    wall, cpu, _ = timed_run(argv, env)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return {
        "ansible_core": version.stdout.splitlines()[0] if version.stdout else "?",
        "forks": parallel,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "load_average_before": before,
        "load_average_after": load(),
    }


def measure(lab: Lab, parallel: int, ansible: bool, scratch: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    before = load()
    floor_s = openssh_floor(lab, parallel)
    figures["openssh_floor"] = {
        "wall_s": round(floor_s, 2),
        "load_average_before": before,
        "load_average_after": load(),
    }
    before = load()
    argv = [*rollout_plan_argv(lab), "--parallel", str(parallel)]
    wall, cpu, out = timed_run(argv)
    planned = {n["name"] for w in json.loads(out)["waves"] for n in w["nodes"]}
    figures["rollout_plan"] = {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "nodes_planned": len(planned),
        "load_average_before": before,
        "load_average_after": load(),
    }
    figures["rollout_vs_floor"] = round(wall / floor_s, 2)
    print(json.dumps(figures), file=sys.stderr, flush=True)  # before Ansible's long run
    if ansible:
        figures["ansible_check_diff"] = measure_ansible(lab, parallel, scratch)
        figures["ansible_vs_rollout"] = round(figures["ansible_check_diff"]["wall_s"] / wall, 2)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--lab-dir", type=Path, default=None)
    parser.add_argument("--address-prefix", default="127.0.84")
    parser.add_argument("--endpoint-prefix", default="127.20")
    parser.add_argument("--no-ansible", dest="ansible", action="store_false")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollout-bench-endpoints-") as tmp:
        scratch = Path(tmp)
        lab_dir = args.lab_dir or scratch / "lab"
        options = LabOptions(
            lab_dir=lab_dir,
            nodes=args.nodes,
            containerd=("1.7",),
            gpus=4,
            address_prefix=args.address_prefix,
            api_port=0,
            endpoints=args.endpoints,
            endpoint_prefix=args.endpoint_prefix,
        )
        started = time.perf_counter()
        lab = bring_up_lab(options, progress=quiet)
        try:
            up_s = time.perf_counter() - started
            figures = measure(lab, args.parallel, args.ansible, scratch)
        finally:
            tear_down_lab(lab_dir, progress=quiet)
    result = {
        "what": "plan -i on lab SSH endpoints (rollout lab up --endpoints N)",
        "reproduce": f".venv/bin/python bench/endpoints.py --endpoints {args.endpoints} "
        f"--parallel {args.parallel} --nodes {args.nodes}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "endpoints": args.endpoints,
        "nodes_serving_them": args.nodes,
        "parallel": args.parallel,
        "lab_up_s": round(up_s, 1),
        "targets": {
            "rollout_vs_floor_at_most": TARGET_FLOOR_RATIO,
            "ansible_vs_rollout_at_least": TARGET_ANSIBLE_RATIO,
        },
        **figures,
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
