"""Issue 13's rows that need the lab: live plan vs the SSH floor, Ansible, and apply P2.

    .venv/bin/python bench/lab_rows.py [--runs 5] [--json PATH]   (also run by bench/run --lab)

Brings up an 8-node lab of its own (containerd 1.6/1.7/2.1/1.7 twice, addresses 127.0.78.N,
a free API port), then measures, interleaved run by run, medians:
- `rollout plan examples/plan.yaml -i` (wall and CPU) against the floor: one OpenSSH process
  per node, in parallel, running the same five fact commands in one `sh`;
- the probe alone (bench/probe.py): paramiko's handshake, one exec per fact, one batch;
- `ansible-playbook --check --diff` of bench/ansible/registry-mirror.yml (ansible-core from
  PyPI in its own venv under the rollout cache, installed on first use; 8 forks, pipelining)
  against `rollout plan -i` of the same change;
- apply P2, last because it changes the nodes: the registry mirror on the 8 nodes, waves
  [1, "50%"], max_unavailable 4; per wave, its wall time (first step started to last node
  finished, from the journal) against the sum of the mandatory waits of its slowest node
  (its systemd.restart, gpu.wait and gpu.smoke steps: containerd's RestartSec, the device
  plugin registering, the smoke pod).
Tears the lab down. Never a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.probe import facts, measure_probe, openssh_argv  # noqa: E402
from rollout.containerd.binaries import cache_dir  # noqa: E402
from rollout.facts.batch import batch_script  # noqa: E402
from rollout.inventory import load_inventory  # noqa: E402
from rollout.lab.cluster import CONTEXT, Lab, LabOptions, bring_up_lab, tear_down_lab  # noqa: E402

PYTHON = sys.executable
PLAN = REPO / "examples" / "plan.yaml"
PLAYBOOK = REPO / "bench" / "ansible" / "registry-mirror.yml"
ADDRESS_PREFIX = "127.0.78"
ANSIBLE_CORE = "ansible-core"
MANDATORY_WAITS = ("systemd.restart", "gpu.wait", "gpu.smoke")
TARGET_FLOOR_RATIO = 1.5
TARGET_ANSIBLE_RATIO = 15.0


def quiet(_: str) -> None:
    pass


def timed_run(argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the process and its children) of one command."""
    start = time.perf_counter()
    process = subprocess.Popen(
        list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=env
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode() if process.stderr else ""
    if code not in (0, 2):  # plan --detailed-exitcode aside, 2 is ansible's "changes" in check
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def rollout_plan_argv(lab: Lab) -> list[str]:
    return [
        PYTHON, "-m", "rollout", "plan", str(PLAN), "-i", str(lab.inventory),
        "--kubeconfig", str(lab.kubeconfig), "--context", CONTEXT, "-o", "json",
    ]  # fmt: skip


def openssh_floor(lab: Lab) -> float:
    """One OpenSSH process per node, in parallel, running the five fact commands in one sh."""
    script = batch_script(facts(), "rollout-fact-floor")
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            openssh_argv(h, script), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for h in load_inventory(lab.inventory).hosts
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("the OpenSSH floor failed on a node")
    return time.perf_counter() - start


def measure_plan_live(lab: Lab, runs: int) -> dict[str, Any]:
    walls, cpus, floors = [], [], []
    for _ in range(runs):
        floors.append(openssh_floor(lab))
        wall, cpu = timed_run(rollout_plan_argv(lab))
        walls.append(wall)
        cpus.append(cpu)
    wall, floor = statistics.median(walls), statistics.median(floors)
    return {
        "runs": runs,
        "rollout_plan_s": round(wall, 3),
        "rollout_plan_cpu_s": round(statistics.median(cpus), 3),
        "openssh_floor_s": round(floor, 3),
        "ratio": round(wall / floor, 2),
        "target_ratio": TARGET_FLOOR_RATIO,
    }


def ansible_playbook() -> Path:
    """ansible-playbook from ansible-core (PyPI), in a venv of its own under the cache."""
    venv = cache_dir() / "ansible-venv"
    binary = venv / "bin" / "ansible-playbook"
    if not binary.exists():
        print(f"installing {ANSIBLE_CORE} into {venv} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", ANSIBLE_CORE], check=True)
    return binary


def ansible_inventory(lab: Lab, path: Path) -> Path:
    lines = ["[gpu]"]
    for host in load_inventory(lab.inventory).hosts:
        lines.append(
            f"{host.name} ansible_host={host.address} ansible_port={host.port} "
            f"ansible_user={host.user} ansible_ssh_private_key_file={host.key_file} "
            f"ansible_ssh_common_args='-o UserKnownHostsFile={host.known_hosts} "
            "-o StrictHostKeyChecking=yes'"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def measure_ansible(lab: Lab, runs: int, scratch: Path) -> dict[str, Any]:
    binary = ansible_playbook()
    inventory = ansible_inventory(lab, scratch / "inventory.ini")
    env = {
        **os.environ,
        "ANSIBLE_FORKS": str(len(lab.nodes)),
        "ANSIBLE_PIPELINING": "true",
        "ANSIBLE_NOCOLOR": "true",
        "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-tmp"),
    }
    argv = [str(binary), "-i", str(inventory), str(PLAYBOOK), "--check", "--diff"]
    check = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    if check.returncode != 0 or "hosts.toml" not in check.stdout:
        raise SystemExit(f"the playbook failed or showed no diff:\n{check.stdout[-3000:]}")
    ansible, rollout = [], []
    for _ in range(runs):
        ansible.append(timed_run(argv, env)[0])
        rollout.append(timed_run(rollout_plan_argv(lab))[0])
    a, r = statistics.median(ansible), statistics.median(rollout)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return {
        "runs": runs,
        "ansible_core": version.stdout.splitlines()[0] if version.stdout else "?",
        "ansible_check_diff_s": round(a, 3),
        "rollout_plan_s": round(r, 3),
        "ansible_slower": round(a / r, 2),
        "target_ansible_slower": TARGET_ANSIBLE_RATIO,
    }


def parse_at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def measure_apply_p2(lab: Lab, scratch: Path) -> dict[str, Any]:
    plan = scratch / "p2.yaml"
    plan.write_text(PLAN.read_text().replace("max_unavailable: 1", "max_unavailable: 4"))
    state = scratch / "p2-state"
    argv = [
        PYTHON, "-m", "rollout", "apply", str(plan), "-i", str(lab.inventory),
        "--kubeconfig", str(lab.kubeconfig), "--context", CONTEXT,
        "--state-dir", str(state), "--yes", "-o", "json",
    ]  # fmt: skip
    wall, _ = timed_run(argv)
    (journal,) = state.glob("runs/*/journal.jsonl")
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    (plan_json,) = state.glob("runs/*/plan.json")
    waves = [[n["name"] for n in w["nodes"]] for w in json.loads(plan_json.read_text())["waves"]]
    started: dict[tuple[str, str], datetime] = {}
    waits: dict[str, float] = {}
    first: dict[str, datetime] = {}
    last: dict[str, datetime] = {}
    for record in records:
        node, at = record.get("node"), parse_at(record["at"])
        if not node:
            continue
        first.setdefault(node, at)
        last[node] = at
        key = (node, str(record.get("step")))
        if record["kind"] == "step-started":
            started[key] = at
        elif record["kind"] == "step-finished" and record.get("step") in MANDATORY_WAITS:
            took = (at - started[key]).total_seconds()
            waits[node] = waits.get(node, 0.0) + took
    rows = []
    for index, names in enumerate(waves, start=1):
        wave_wall = (max(last[n] for n in names) - min(first[n] for n in names)).total_seconds()
        slowest = max(names, key=lambda n: (last[n] - first[n]).total_seconds())
        rows.append(
            {
                "wave": index,
                "nodes": len(names),
                "wall_s": round(wave_wall, 2),
                "slowest_node": slowest,
                "slowest_node_waits_s": round(waits.get(slowest, 0.0), 2),
                "ratio": round(wave_wall / waits[slowest], 2) if waits.get(slowest) else None,
            }
        )
    return {"apply_wall_s": round(wall, 2), "max_unavailable": 4, "waves": rows}


def measure_lab_rows(runs: int, nodes: int = 8) -> dict[str, Any]:
    series = tuple(("1.6", "1.7", "2.1", "1.7")[i % 4] for i in range(nodes))
    with tempfile.TemporaryDirectory(prefix="rollout-bench-lab-") as tmp:
        scratch = Path(tmp)
        options = LabOptions(
            lab_dir=scratch / "lab",
            nodes=len(series),
            containerd=series,
            gpus=2,
            address_prefix=ADDRESS_PREFIX,
            api_port=0,
        )
        print(f"lab up ({nodes} nodes) ...", file=sys.stderr)
        try:
            lab = bring_up_lab(options, progress=quiet)
            results: dict[str, Any] = {"nodes": len(lab.nodes)}
            print("plan -i vs the OpenSSH floor ...", file=sys.stderr)
            results["plan_live"] = measure_plan_live(lab, runs)
            print("probe: handshake, per fact, batched ...", file=sys.stderr)
            results["probe"] = measure_probe(lab.inventory, runs)
            print("ansible-playbook --check --diff vs plan -i ...", file=sys.stderr)
            results["ansible"] = measure_ansible(lab, runs, scratch)
            print("apply P2 ...", file=sys.stderr)
            results["apply_p2"] = measure_apply_p2(lab, scratch)
        finally:
            if options.lab_dir.exists():  # also after a lab that failed to come up
                tear_down_lab(options.lab_dir, progress=quiet)
    results["peak_rss_mb_children"] = round(
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
    )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--nodes", type=int, default=8, help="lab nodes (8, as issue 13 asks)")
    args = parser.parse_args()
    results = measure_lab_rows(args.runs, args.nodes)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
