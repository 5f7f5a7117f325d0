"""Issue 13's rows that need the lab: live plan vs the SSH floor, Ansible, and apply P2.

    .venv/bin/python bench/lab_rows.py [--runs 5] [--nodes 8] [--json PATH]
        [--before DIR] [--lab DIR] [--skip-apply]             (also run by bench/run --lab)

Brings up a lab of its own (containerd 1.6/1.7/2.1/1.7 cycled, addresses 127.0.78.N, a free
API port; `--lab DIR` uses a lab that is up instead and leaves it up), then measures, each
round interleaved, medians over the rounds:
- `rollout plan examples/plan.yaml -i` (wall and CPU, its children's too) against the floor:
  one OpenSSH process per node, in parallel, running the same five fact commands in one
  `sh`. rollout runs twice per round: cold (an empty containerd dump memo, as the first plan
  after an upgrade: every local `config dump` run, each binary hashed) and warm (the memo
  the runs before left: what a second plan of the same fleet costs). With `--before DIR`, a
  checkout of the code before (`git worktree add DIR COMMIT`) runs in the same rounds, and
  every variant's output is checked byte-identical;
- what plan -i imports, in a fresh interpreter: the libraries alone (kubernetes' API classes
  it calls, fabric and paramiko, pydantic, YAML, TOML), and with rollout's own modules: the
  CPU any plan -i spends here before it does anything;
- the probe alone (bench/probe.py): paramiko's handshake, one exec per fact, one batch;
- `ansible-playbook --check --diff` of bench/ansible/registry-mirror.yml (ansible-core from
  PyPI in its own venv under the rollout cache, installed on first use; one fork per node,
  pipelining) against `rollout plan -i` (warm) of the same change, with the arithmetic of
  the target: how fast plan -i would have to be for Ansible to be 15x slower, against the
  floor;
- apply P2, last because it changes the nodes (`--skip-apply` leaves it out): the registry
  mirror on the nodes, waves [1, "50%"], max_unavailable 4; per wave, its wall time (first
  step started to last node finished, from the journal) against the sum of the mandatory
  waits of its slowest node (its systemd.restart, gpu.wait and gpu.smoke steps: containerd's
  RestartSec, the device plugin registering, the smoke pod).
The load average is recorded before and after each row. Never a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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
from rollout.containerd.localdump import DUMP_CACHE_ENV  # noqa: E402
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


def timed_run(
    argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path = REPO
) -> tuple[float, float, bytes]:
    """Wall and CPU seconds (user + system of the process and its children) of one command,
    and its stdout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(list(argv), stdout=out, stderr=err, cwd=cwd, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 2):  # plan --detailed-exitcode aside, 2 is ansible's "changes" in check
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, stdout


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rollout_plan_argv(lab: Lab) -> list[str]:
    return [
        PYTHON, "-m", "rollout", "plan", str(PLAN), "-i", str(lab.inventory),
        "--kubeconfig", str(lab.kubeconfig), "--context", CONTEXT, "-o", "json",
    ]  # fmt: skip


def with_dump_memo(memo: Path) -> dict[str, str]:
    return {**os.environ, DUMP_CACHE_ENV: str(memo)}


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


def digests_only(memo: Path, into: Path) -> Path:
    """A dump memo holding only `memo`'s digests of the binaries (no dump, no version)."""
    into.mkdir(parents=True)
    for entry in memo.glob("*.json"):
        if json.loads(entry.read_bytes())["key"].startswith('["file sha256"'):
            shutil.copy(entry, into / entry.name)
    return into


# What plan -i imports: the libraries alone (kubernetes' client and configuration, no API
# class, SSH, the spec's models, YAML and TOML), and with rollout's own modules.
IMPORT_LIBRARIES = """
from kubernetes import client, config
client.ApiClient
import fabric, paramiko, pydantic, yaml, tomlkit, tomllib, tenacity
"""
IMPORT_ALL = IMPORT_LIBRARIES + "import rollout.cli.plan, rollout.connection, rollout.planner\n"


def checkout_commit(directory: Path) -> str:
    """The short commit a checkout is at, or "unknown" outside git."""
    found = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() if found.returncode == 0 else "unknown"


def measure_plan_live(
    lab: Lab, runs: int, scratch: Path, before: Path | None = None
) -> dict[str, Any]:
    """plan -i against the floor, interleaved per round: with an empty dump memo (`first`: the
    binaries hashed, every dump run), with only the binaries' digests kept (`cold`: every
    dump run, as for configurations not seen before), with the memo the runs before left
    (`warm`), and the code before."""
    # Both trees byte-compiled, as an installed rollout is: where PYTHONDONTWRITEBYTECODE is
    # set, a tree never compiled would pay its compilation (about 0.1 s) on every run.
    for tree in (REPO, before) if before is not None else (REPO,):
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(tree / "rollout")], check=True)
    warm_memo = scratch / "dump-memo-warm"
    timed_run(rollout_plan_argv(lab), with_dump_memo(warm_memo))  # fills the warm memo
    samples: dict[str, list[tuple[float, float]]] = {}
    outputs: dict[str, set[bytes]] = {}
    load_before = load()
    for round_ in range(runs):
        samples.setdefault("floor", []).append((openssh_floor(lab), 0.0))
        variants = {
            "first": (REPO, with_dump_memo(scratch / f"dump-memo-first-{round_}")),
            "cold": (REPO, with_dump_memo(digests_only(warm_memo, scratch / f"cold-{round_}"))),
            "warm": (REPO, with_dump_memo(warm_memo)),
        }
        if before is not None:
            variants["before"] = (before, dict(os.environ))
        for name, (cwd, env) in variants.items():
            wall, cpu, out = timed_run(rollout_plan_argv(lab), env, cwd)
            samples.setdefault(name, []).append((wall, cpu))
            outputs.setdefault(name, set()).add(out)
        for name, script in (("libraries", IMPORT_LIBRARIES), ("imports", IMPORT_ALL)):
            wall, cpu, _ = timed_run([PYTHON, "-c", script])
            samples.setdefault(name, []).append((wall, cpu))
    medians: dict[str, dict[str, Any]] = {
        name: {
            "wall_s": round(statistics.median(w for w, _ in found), 3),
            "cpu_s": round(statistics.median(c for _, c in found), 3),
            "wall_range_s": [
                round(min(w for w, _ in found), 3),
                round(max(w for w, _ in found), 3),
            ],
        }
        for name, found in samples.items()
    }
    floor, warm = medians["floor"]["wall_s"], medians["warm"]
    distinct = set().union(*outputs.values())
    return {
        "runs": runs,
        "load_average_before": load_before,
        "load_average_after": load(),
        "openssh_floor_s": floor,
        "rollout_plan_s": warm["wall_s"],
        "rollout_plan_cpu_s": warm["cpu_s"],
        "ratio": round(warm["wall_s"] / floor, 2),
        "ratio_cold": round(medians["cold"]["wall_s"] / floor, 2),
        "ratio_before": round(medians["before"]["wall_s"] / floor, 2) if before else None,
        "imports_cpu_s": medians["imports"]["cpu_s"],
        "library_imports_cpu_s": medians["libraries"]["cpu_s"],
        "variants": medians,
        # the commit the code before was checked out at, never the folder's path
        "before": checkout_commit(before) if before else None,
        "outputs_identical": len(distinct) == 1,
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


def measure_ansible(lab: Lab, runs: int, scratch: Path, floor_s: float) -> dict[str, Any]:
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
    warm = with_dump_memo(scratch / "dump-memo-warm")
    load_before = load()
    ansible, rollout = [], []
    for _ in range(runs):
        ansible.append(timed_run(argv, env)[0])
        rollout.append(timed_run(rollout_plan_argv(lab), warm)[0])
    a, r = statistics.median(ansible), statistics.median(rollout)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    needed = a / TARGET_ANSIBLE_RATIO
    return {
        "runs": runs,
        "load_average_before": load_before,
        "load_average_after": load(),
        "ansible_core": version.stdout.splitlines()[0] if version.stdout else "?",
        "ansible_check_diff_s": round(a, 3),
        "rollout_plan_s": round(r, 3),
        "ansible_slower": round(a / r, 2),
        "target_ansible_slower": TARGET_ANSIBLE_RATIO,
        # the target's arithmetic: plan -i would have to take ansible / 15, against the floor
        "plan_needed_for_target_s": round(needed, 3),
        "openssh_floor_s": floor_s,
        "needed_vs_floor": round(needed / floor_s, 2),
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
    wall, _, _ = timed_run(argv)
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


def measure_lab_rows(
    runs: int,
    nodes: int = 8,
    before: Path | None = None,
    lab_dir: Path | None = None,
    skip_apply: bool = False,
) -> dict[str, Any]:
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
        try:
            if lab_dir is not None:
                lab = Lab.from_lab_dir(lab_dir)
            else:
                print(f"lab up ({nodes} nodes) ...", file=sys.stderr)
                lab = bring_up_lab(options, progress=quiet)
            results: dict[str, Any] = {"nodes": len(lab.nodes)}
            print("plan -i vs the OpenSSH floor ...", file=sys.stderr)
            results["plan_live"] = measure_plan_live(lab, runs, scratch, before)
            print("probe: handshake, per fact, batched ...", file=sys.stderr)
            results["probe"] = measure_probe(lab.inventory, runs)
            print("ansible-playbook --check --diff vs plan -i ...", file=sys.stderr)
            floor = results["plan_live"]["openssh_floor_s"]
            results["ansible"] = measure_ansible(lab, runs, scratch, floor)
            if not skip_apply:
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
    parser.add_argument(
        "--before", type=Path, help="a checkout of the code before, measured in the same rounds"
    )
    parser.add_argument("--lab", type=Path, help="a lab that is up (left up), instead of a new one")
    parser.add_argument("--skip-apply", action="store_true", help="leave apply P2 out")
    args = parser.parse_args()
    results = measure_lab_rows(args.runs, args.nodes, args.before, args.lab, args.skip_apply)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
