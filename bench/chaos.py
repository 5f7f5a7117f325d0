"""Benchmark: the demo plan under injected faults, per fault rate: completion, invariant
violations (must be 0), retries and wall time.

    bench/chaos [--lab-dir DIR] [--seeds 3] [--api 0,0.1,0.2,0.3] [--ssh 0,0.05,0.1] [--grid]

Brings up a 4-node lab of its own (addresses 127.0.79.N, or --address-prefix) unless
--lab-dir names one that is up, applies the demo plan once without faults (its cluster-wide
change settles), then for each rate and seed applies a variant of the demo plan (a new
mirror endpoint: new files on every node) under `rollout lab faults`. A run that halts is
resumed without faults, so the next one starts from a converged lab; it counts as not
completed. By default the API rates run with no SSH faults and the SSH rates with no API
faults; --grid runs every pair.

Invariants checked after each run, with faults off, from the nodes and the API themselves:
each planned file on each node is whole (its hash is the old or the new content's), written
at most once (journal), every journalled backup is on its node with its hash, at most one
containerd start per node per run (the node's systemd journal), at most one cordon and one
uncordon Event per node, no smoke pod left, and no node left cordoned once the run completed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rollout.cli import main as rollout
from rollout.lab.cluster import CONTEXT, Lab, LabOptions, bring_up_lab, tear_down_lab
from rollout.lab.faults import parse_fault_spec, read_fault_log, write_settings
from rollout.run import list_runs, read_run
from rollout.transports.kube import KubeClient
from rollout.transports.local import LocalRunner

REPO = Path(__file__).resolve().parents[1]
DEMO_PLAN = REPO / "examples" / "lab-plan.yaml"
MIRROR = "https://mirror.registry.internal:5000"


@dataclass
class Outcome:
    completed: bool
    violations: list[str] = field(default_factory=list)
    retries: int = 0
    faults: int = 0
    wall_s: float = 0.0


def ssh(lab: Lab, name: str, argv: list[str]) -> str:
    node = lab.find_node(name)
    result = LocalRunner().run(lab.ssh.argv(node.address, argv), timeout_s=60)
    return result.stdout if result.ok else ""


def starts(lab: Lab) -> dict[str, int]:
    out = {}
    for node in lab.nodes:
        text = ssh(lab, node.name, ["journalctl", "-u", "containerd", "-o", "cat", "--no-pager"])
        out[node.name] = sum(1 for line in text.splitlines() if line.startswith("Started "))
    return out


def sha(text: str | None) -> str | None:
    return hashlib.sha256(text.encode()).hexdigest() if text is not None else None


def check_run(lab: Lab, kube: KubeClient, state: Path, before: dict[str, int]) -> list[str]:
    """The invariants' violations after one run (and its resume), read from the lab."""
    (run,) = list_runs(state)
    final = read_run(state, run.run_id)
    entries = [json.loads(line) for line in (run.run_dir / "journal.jsonl").open()]
    plan = json.loads((run.run_dir / "plan.json").read_text())
    problems: list[str] = []
    writes = Counter(
        e["node"]
        for e in entries
        if e["kind"] == "step-finished"
        and (e["step"], e["outcome"]) == ("containerd.write", "done")
    )
    problems += [f"{n}: files written {c} times" for n, c in writes.items() if c > 1]
    for node in (n for wave in plan["waves"] for n in wave["nodes"]):
        name = node["name"]
        for change in node.get("files") or []:
            now = ssh(lab, name, ["sh", "-c", f"sha256sum {change['path']} 2>/dev/null"])
            digest = now.split()[0] if now else None
            if digest not in (sha(change.get("before")), sha(change.get("after"))):
                problems.append(f"{name}: {change['path']} is neither the old nor the new file")
        for backup in final.node(name).backups:
            listed = ssh(lab, name, ["sha256sum", backup.backup_path]).split()
            if not listed or listed[0] != backup.sha256:
                problems.append(f"{name}: backup {backup.backup_path} lost or changed")
    after = starts(lab)
    problems += [f"{n}: containerd started {after[n] - before[n]} times" for n in after
                 if after[n] - before[n] > 1]  # fmt: skip
    events = Counter(
        (e.involved_name, e.reason)
        for e in kube.list_events("default")
        if run.run_id in e.message and e.reason in ("RolloutCordon", "RolloutUncordon")
    )
    problems += [f"{n}: {r} recorded {c} times" for (n, r), c in events.items() if c > 1]
    if [p for p in kube.list_pods(None) if p.name.startswith("rollout-smoke")]:
        problems.append("a smoke pod was left behind")
    if final.outcome is not None and final.outcome.value == "succeeded":
        problems += [f"{n.name}: left cordoned" for n in lab.nodes
                     if kube.get_node(n.name).unschedulable]  # fmt: skip
    return problems


def apply_once(lab: Lab, kube: KubeClient, spec: str, seed: int, work: Path, port: int) -> Outcome:
    plan = work / f"plan-{port}.yaml"
    plan.write_text(DEMO_PLAN.read_text().replace(MIRROR, f"https://mirror.internal:{port}"))
    state = work / f"state-{port}"
    before = starts(lab)
    faults_before = len(read_fault_log(lab.lab_dir))
    write_settings(lab.lab_dir, parse_fault_spec(spec, seed))
    args = ["apply", str(plan), "--inventory", str(lab.inventory), "--kubeconfig"]
    args += [str(lab.kubeconfig), "--context", CONTEXT, "--state-dir", str(state), "--yes"]
    started = time.monotonic()
    with quiet():
        code = rollout(args)
    wall_s = time.monotonic() - started
    write_settings(lab.lab_dir, parse_fault_spec("off"))
    faults = len(read_fault_log(lab.lab_dir)) - faults_before
    if not list_runs(state):  # refused before its run began (facts could not be gathered)
        return Outcome(False, [], 0, faults, wall_s)
    (run,) = list_runs(state)
    completed = code == 0
    for _ in range(3):  # back to a converged lab for the next run
        if read_run(state, run.run_id).outcome is not None:
            break
        time.sleep(5)
        with quiet():
            rollout(["resume", run.run_id, "--state-dir", str(state)])
    retried = sum(
        1 for line in (run.run_dir / "journal.jsonl").open() if '"kind": "retried"' in line
    )
    return Outcome(
        completed,
        check_run(lab, kube, state, before),
        retried,
        faults,
        wall_s,
    )


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with (
        open("/dev/null", "w") as sink,
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
    ):
        yield


@contextlib.contextmanager
def a_lab(lab_dir: str | None, address_prefix: str) -> Iterator[Lab]:
    if lab_dir:
        yield Lab.from_lab_dir(Path(lab_dir))
        return
    with tempfile.TemporaryDirectory(prefix="rollout-chaos-") as tmp:
        options = LabOptions(
            lab_dir=Path(tmp) / "lab",
            nodes=4,
            containerd=("1.6", "1.7", "2.1", "1.7"),
            gpus=2,
            address_prefix=address_prefix,
            api_port=0,
        )
        lab = bring_up_lab(options, progress=lambda _: None)
        try:
            yield lab
        finally:
            tear_down_lab(options.lab_dir, progress=lambda _: None)


def rates(text: str) -> list[float]:
    return [float(r) for r in text.split(",") if r.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab-dir", help="a lab that is up (4 nodes, --gpus 2) instead")
    parser.add_argument("--address-prefix", default="127.0.79", help="its lab's nodes' /24")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--api", type=rates, default=[0, 0.1, 0.2, 0.3])
    parser.add_argument("--ssh", type=rates, default=[0, 0.05, 0.1])
    parser.add_argument("--grid", action="store_true", help="every (api, ssh) pair")
    args = parser.parse_args()
    if args.grid:
        settings = list(itertools.product(args.api, args.ssh))
    else:
        settings = [(a, 0.0) for a in args.api] + [(0.0, s) for s in args.ssh if s]
    # rollout gives up on an answer after 2 s; a `slow` fault answers after 3 s
    os.environ["ROLLOUT_API_TIMEOUT_S"] = "2"
    ports = itertools.count(30000 + int(time.time()) % 20000)
    violations = 0
    with (
        a_lab(args.lab_dir, args.address_prefix) as lab,
        KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube,
        tempfile.TemporaryDirectory(prefix="rollout-chaos-runs-") as tmp,
    ):
        work = Path(tmp)
        warm = apply_once(lab, kube, "off", 0, work, next(ports))
        print(f"warm-up (no faults): completed={warm.completed}, {warm.wall_s:.1f}s")
        print(f"{'api':>5} {'ssh':>5}  completed  violations  faults  retries  wall s (median)")
        for api, ssh_rate in settings:
            spec = f"api={api},ssh={ssh_rate},slow=3"
            outcomes = [
                apply_once(lab, kube, spec, seed, work, next(ports))
                for seed in range(1, args.seeds + 1)
            ]
            broken = [v for o in outcomes for v in o.violations]
            violations += len(broken)
            print(
                f"{api:>5g} {ssh_rate:>5g}  "
                f"{sum(o.completed for o in outcomes)}/{len(outcomes):<8} "
                f"{len(broken):>10}  {sum(o.faults for o in outcomes):>6}  "
                f"{sum(o.retries for o in outcomes):>7}  "
                f"{statistics.median(o.wall_s for o in outcomes):>7.1f}",
                flush=True,
            )
            for problem in broken:
                print(f"    VIOLATION: {problem}")
    print(f"invariant violations: {violations} (must be 0)")
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
