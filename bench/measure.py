"""Fleet-scale measurements of issue 13: `plan --facts` at 1k and 10k nodes, and start-up.

    bench/run [--json PATH] [--runs N] [--sizes 1000,10000] [--work DIR] [--lab-up]
              [--lab [--lab-nodes 8] [--before DIR]]

Generates the recorded fleets (bench/fleet.py), then measures, each as the median of several
runs: `rollout plan examples/plan.yaml --facts DIR -o json` wall time and peak RSS per fleet
size, with one in-process run split into phases (load facts, plan, render) to say where the
time goes; and `rollout --help` against `python -c pass`, interleaved. Prints a table with
the targets and writes JSON (bench/results.json unless --json). Never a timed test: the
numbers depend on the machine and on what else runs on it.

With --lab it also brings up an 8-node lab (--lab-nodes) and measures the rows that need one
(bench/lab_rows.py): `plan -i` against the OpenSSH floor (with the containerd dump memo
warm, cold and empty, and the code of --before DIR in the same rounds), what its imports
alone cost, the probe's handshake and round trips, `ansible-playbook --check --diff`
against `plan -i`, and apply P2 per wave.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.fleet import generate_fleet  # noqa: E402

PYTHON = sys.executable
PLAN = REPO / "examples" / "plan.yaml"
TARGET_PLAN_S = 3.0  # 10,000 nodes
TARGET_PLAN_MB = 500.0
TARGET_STARTUP_RATIO = 3.0


def run_measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one command, its output thrown away."""
    wall, mb, _ = run_measured_cpu(argv)
    return wall, mb


def run_measured_cpu(argv: list[str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MB) and CPU seconds (user + system) of one command: CPU time
    is the figure to compare on a shared machine, where the wall time depends on the load."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({process.returncode}): {stderr[-2000:]}")
    return elapsed, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime  # Linux: KiB


def plan_argv(facts: Path, output: str) -> list[str]:
    return [PYTHON, "-m", "rollout", "plan", str(PLAN), "--facts", str(facts), "-o", output]


def measure_plan(facts: Path, runs: int, output: str) -> dict[str, Any]:
    samples = [run_measured_cpu(plan_argv(facts, output)) for _ in range(runs)]
    return {
        "output": output,
        "runs": runs,
        "median_s": statistics.median(s for s, _, _ in samples),
        "wall_s": [round(s, 3) for s, _, _ in samples],
        "median_cpu_s": round(statistics.median(c for _, _, c in samples), 3),
        "peak_rss_mb": max(m for _, m, _ in samples),
    }


def measure_phases(facts: Path) -> dict[str, float]:
    """One in-process plan, CPU seconds by phase (a fresh interpreter, so no memo is warm)."""
    script = f"""
import io, json, sys, time
t0 = time.process_time()
from rollout.cli.render import make_console, plan_to_json, print_plan_text
from rollout.facts import load_recorded_facts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import load_spec
from rollout.changes import kind_planners
from rollout.changes.containerd.kind import ContainerdKind, RegistryKind
from pathlib import Path
t1 = time.process_time()
spec = load_spec(Path({str(PLAN)!r}))
fleet = load_recorded_facts(Path({str(facts)!r}))
t2 = time.process_time()
made = []
kinds = {{**kind_planners(), "registry": RegistryKind(plans_made=made),
    "containerd": ContainerdKind(plans_made=made)}}
plan = build_plan(spec, "plan.yaml", fleet, load_playbooks(), kinds=kinds)
t3 = time.process_time()
plan_to_json(plan)
t4 = time.process_time()
print_plan_text(plan, make_console(io.StringIO(), False))
t5 = time.process_time()
print(json.dumps({{"import_s": t1 - t0, "load_facts_s": t2 - t1, "build_plan_s": t3 - t2,
    "render_json_s": t4 - t3, "render_text_s": t5 - t4, "engine_runs": sum(p.runs for p in made)}}))
"""
    result = subprocess.run(
        [PYTHON, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    )
    phases: dict[str, float] = json.loads(result.stdout)
    return {k: round(v, 3) for k, v in phases.items()}


def measure_startup(runs: int) -> dict[str, Any]:
    """`python -m rollout --help` against `python -c pass`, interleaved, medians."""
    bare: list[float] = []
    helps: list[float] = []
    rss: list[float] = []
    for _ in range(runs):
        bare.append(run_measured([PYTHON, "-c", "pass"])[0])
        seconds, mb = run_measured([PYTHON, "-m", "rollout", "--help"])
        helps.append(seconds)
        rss.append(mb)
    bare_s, help_s = statistics.median(bare), statistics.median(helps)
    return {
        "runs": runs,
        "python_pass_s": round(bare_s, 4),
        "rollout_help_s": round(help_s, 4),
        "ratio": round(help_s / bare_s, 2),
        "rollout_help_peak_rss_mb": round(max(rss), 1),
    }


def print_table(results: dict[str, Any]) -> None:
    rows = [("measure", "now", "target")]
    for size, entry in results["plan"].items():
        target = (
            f"<= {TARGET_PLAN_S:g} s, <= {TARGET_PLAN_MB:g} MB"
            if int(size) == 10000
            else "linear in nodes"
        )
        rows.append(
            (
                f"plan --facts, {int(size):,} nodes (-o {entry['output']})",
                f"{entry['median_s']:.2f} s (median of {entry['runs']}; "
                f"{entry['median_cpu_s']:.2f} s CPU), {entry['peak_rss_mb']:.0f} MB",
                target,
            )
        )
        phases = entry["phases"]
        rows.append(
            (
                "  of which, CPU (one run)",
                f"load facts {phases['load_facts_s']:.2f} s, plan {phases['build_plan_s']:.2f} s, "
                f"json {phases['render_json_s']:.2f} s, text {phases['render_text_s']:.2f} s, "
                f"{phases['engine_runs']} engine run(s)",
                "",
            )
        )
    start = results["startup"]
    rows.append(
        (
            "rollout --help vs python -c pass",
            f"{start['ratio']:.2f}x ({start['rollout_help_s'] * 1000:.0f} ms vs "
            f"{start['python_pass_s'] * 1000:.0f} ms), {start['rollout_help_peak_rss_mb']:.0f} MB",
            f"<= {TARGET_STARTUP_RATIO:g}x",
        )
    )
    rows.extend(lab_table_rows(results.get("lab")))
    rows.extend(lab_up_row(results.get("lab_up")))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def lab_up_row(lab_up: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The `lab up` row (bench/lab_up.py), when it was measured."""
    from bench.lab_up import table_row

    return table_row(lab_up)


def lab_table_rows(lab: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The lab rows of the table (bench/lab_rows.py), when they were measured."""
    if not lab:
        return []
    live, probe, ansible = lab["plan_live"], lab["probe"], lab["ansible"]
    variants = live.get("variants", {})
    rows = [
        (
            f"plan -i, {lab['nodes']} lab nodes vs OpenSSH floor (dump memo warm)",
            f"{live['ratio']:.2f}x ({live['rollout_plan_s']:.2f} s vs "
            f"{live['openssh_floor_s']:.2f} s; {live['rollout_plan_cpu_s']:.2f} s CPU)",
            f"<= {live['target_ratio']:g}x",
        ),
    ]
    for name, label in (
        ("cold", "  dump memo cold (new configurations)"),
        ("first", "  dump memo empty (binaries hashed too)"),
        ("before", "  the code before"),
    ):
        if name in variants:
            found = variants[name]
            rows.append(
                (
                    label,
                    f"{found['wall_s'] / live['openssh_floor_s']:.2f}x ({found['wall_s']:.2f} s; "
                    f"{found['cpu_s']:.2f} s CPU)",
                    "",
                )
            )
    if "imports" in variants and "libraries" in variants:
        rows.append(
            (
                "  its imports alone (libraries alone)",
                f"{variants['imports']['cpu_s']:.2f} s CPU "
                f"({variants['libraries']['cpu_s']:.2f} s)",
                "",
            )
        )
    rows.append(
        (
            "  probe: handshake / per fact / batched",
            f"{probe['handshake_s']:.2f} s / {probe['per_fact_s']:.2f} s / "
            f"{probe['batched_s']:.2f} s",
            "",
        )
    )
    rows.append(
        (
            "ansible-playbook --check --diff vs plan -i",
            f"Ansible {ansible['ansible_slower']:.2f}x slower "
            f"({ansible['ansible_check_diff_s']:.2f} s vs {ansible['rollout_plan_s']:.2f} s)",
            f">= {ansible['target_ansible_slower']:g}x",
        )
    )
    if "plan_needed_for_target_s" in ansible:
        rows.append(
            (
                "  plan -i needed for the target",
                f"{ansible['plan_needed_for_target_s']:.2f} s = "
                f"{ansible['needed_vs_floor']:.2f}x the floor",
                "",
            )
        )
    for wave in lab.get("apply_p2", {}).get("waves", []):
        rows.append(
            (
                f"apply P2, wave {wave['wave']} ({wave['nodes']} node(s))",
                f"{wave['wall_s']:.1f} s vs {wave['slowest_node_waits_s']:.1f} s of mandatory "
                f"waits on its slowest node ({wave['ratio']}x)",
                "waits overlap",
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results.json")
    parser.add_argument("--runs", type=int, default=3, help="runs per plan measure (3)")
    parser.add_argument("--startup-runs", type=int, default=20)
    parser.add_argument("--sizes", default="1000,10000", help="fleet sizes (1000,10000)")
    parser.add_argument("--output", choices=("text", "markdown", "json"), default="json")
    parser.add_argument("--work", type=Path, help="where the fleets go (default: a temp dir)")
    parser.add_argument(
        "--lab", action="store_true", help="also the rows that need an 8-node lab (root)"
    )
    parser.add_argument("--lab-nodes", type=int, default=8, help="the lab rows' nodes (8)")
    parser.add_argument(
        "--before", type=Path, help="the lab rows: a checkout of the code before, run alongside"
    )
    parser.add_argument(
        "--lab-up", action="store_true", help="also `rollout lab up` of 4 nodes (root)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "note": "wall times depend on the machine's load (load_average); CPU times less so",
        "plan": {},
    }
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as scratch:
        work = args.work or Path(scratch)
        for size in sizes:
            facts = work / f"fleet-{size}"
            generate_fleet(facts, size)
            print(f"plan --facts of {size:,} nodes ...", file=sys.stderr)
            entry = measure_plan(facts, args.runs, args.output)
            entry["phases"] = measure_phases(facts)
            results["plan"][str(size)] = entry
    print("start-up ...", file=sys.stderr)
    results["startup"] = measure_startup(args.startup_runs)
    if args.lab:
        from bench.lab_rows import measure_lab_rows

        results["lab"] = measure_lab_rows(args.runs, args.lab_nodes, args.before)
    if args.lab_up:
        from bench.lab_up import measure_lab_up

        print("lab up ...", file=sys.stderr)
        results["lab_up"] = measure_lab_up(args.runs)
    results["machine"]["load_average_after"] = os.getloadavg()
    print_table(results)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
