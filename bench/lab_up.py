"""Benchmark: `lab up` of 4 nodes with the image cache warm (target: under 60 s), and `lab down`.

    .venv/bin/python bench/lab_up.py [--rounds N]

Needs root and the lab's prerequisites (scripts/setup --test). Builds the image first if
the cache is cold, outside the timing. Uses its own addresses (127.0.77.N) and a free API
port so it never meets a lab a user has running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rollout.lab.cluster import LabOptions, bring_up_lab, tear_down_lab
from rollout.lab.image import build_image
from rollout.lab.prerequisites import require_prerequisites

TARGET_UP_S = 60.0


def quiet(_: str) -> None:
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_prerequisites()
    build_image(progress=quiet)
    ups: list[float] = []
    downs: list[float] = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
            options = LabOptions(
                lab_dir=Path(tmp) / "lab",
                nodes=4,
                containerd=("1.6", "1.7", "2.1", "1.7"),
                address_prefix="127.0.77",
                api_port=0,
            )
            start = time.monotonic()
            bring_up_lab(options, progress=quiet)
            ups.append(time.monotonic() - start)
            start = time.monotonic()
            tear_down_lab(options.lab_dir, progress=quiet)
            downs.append(time.monotonic() - start)
    print(
        f"lab up   (4 nodes, warm cache): median {statistics.median(ups):.1f}s, max {max(ups):.1f}s"
    )
    print(f"lab down (4 nodes):             median {statistics.median(downs):.1f}s")
    ok = max(ups) < TARGET_UP_S
    print(f"target lab up < {TARGET_UP_S:.0f}s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
