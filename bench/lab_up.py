"""Benchmark: `rollout lab up` of 4 nodes with the image cache warm (target: under 60 s).

    .venv/bin/python bench/lab_up.py [--runs N] [--json PATH]   (also bench/run --lab-up)

Runs the real command line, `python -m rollout lab up --nodes 4` (containerd 1.6, 1.7,
2.1, 1.7, the default GPUs), N times (3), each into a fresh lab directory on addresses of
its own (127.0.77.N) and a free API port, and times it from start to exit: the overlays,
the boots, containerd ready on every node, the control plane up with every node's toolkit
run (its containerd restart included) and every device plugin registered. `lab down` is
timed too. Prints the median and the slowest run against the target. Needs root and the
lab's prerequisites (scripts/setup --lab); builds the image first when the cache is cold,
outside the timing. Never a timed test: the numbers depend on what else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.lab.image import build_image  # noqa: E402
from rollout.lab.prerequisites import require_prerequisites  # noqa: E402

TARGET_UP_S = 60.0
NODES = 4
ADDRESS_PREFIX = "127.0.77"


def run_timed(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return elapsed


def measure_lab_up(runs: int) -> dict[str, Any]:
    """Median and slowest `rollout lab up` (4 nodes, warm cache) and `lab down`, in seconds."""
    require_prerequisites()
    build_image(progress=lambda _: None)  # warm the cache outside the timing
    rollout = [sys.executable, "-m", "rollout", "lab"]
    ups: list[float] = []
    downs: list[float] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
            lab_dir = str(Path(tmp) / "lab")
            ups.append(
                run_timed(
                    [
                        *rollout,
                        "up",
                        *("--nodes", str(NODES), "--lab-dir", lab_dir),
                        *("--address-prefix", ADDRESS_PREFIX, "--api-port", "0"),
                    ]
                )
            )
            downs.append(run_timed([*rollout, "down", "--lab-dir", lab_dir]))
    return {
        "nodes": NODES,
        "runs": runs,
        "up_median_s": round(statistics.median(ups), 2),
        "up_max_s": round(max(ups), 2),
        "up_s": [round(s, 2) for s in ups],
        "down_median_s": round(statistics.median(downs), 2),
        "target_up_s": TARGET_UP_S,
        "load_average": os.getloadavg(),
    }


def table_row(result: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """bench/run's row: measure, now, target."""
    if not result:
        return []
    return [
        (
            f"rollout lab up, {result['nodes']} nodes, warm cache",
            f"{result['up_median_s']:.1f} s (median of {result['runs']}, slowest "
            f"{result['up_max_s']:.1f} s); down {result['down_median_s']:.1f} s",
            f"< {result['target_up_s']:g} s",
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = measure_lab_up(args.runs)
    for measure, now, target in table_row(result):
        print(f"{measure}: {now} (target {target})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["up_max_s"] < TARGET_UP_S else 1


if __name__ == "__main__":
    sys.exit(main())
