"""Generate a recorded-facts fleet of N nodes by copying the example nodes under new names.

    .venv/bin/python bench/fleet.py DIR N [--source examples/facts]

Node i is a copy of the (i mod 4)th example node, renamed `<example>-<i>` (node.yaml `name:`
and the hostname label rewritten): a fleet of a few distinct node configurations repeated
many times, as a real GPU fleet is (the toolkit writes byte-identical drop-ins per pool).

    .venv/bin/python bench/fleet.py DIR N --gpu-counts 1,2,4,8,16

With GPU counts, the fleet is pools in contiguous blocks of names: one pool per example node
and GPU count (4 x 5 = 20 distinct node configurations), as a fleet of several machine types.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "facts"


def generate_fleet(
    target: Path, count: int, source: Path = EXAMPLES, gpu_counts: tuple[int, ...] = ()
) -> list[str]:
    """Write `count` node directories under `target` (emptied first); returns their names.

    With `gpu_counts`, node i is in pool i * pools // count of the pools (example node, GPU
    count), so each pool's names are one range.
    """
    templates = sorted(p for p in source.iterdir() if (p / "node.yaml").is_file())
    if not templates:
        raise SystemExit(f"no node facts under {source}")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    width = len(str(count))
    names = []
    pools = [(t, gpus) for t in templates for gpus in gpu_counts]
    for index in range(count):
        template, gpus = (
            pools[index * len(pools) // count] if pools else (templates[index % len(templates)], 0)
        )
        name = f"{template.name}-{index:0{width}d}"
        shutil.copytree(template / "files", target / name / "files")
        text = (template / "node.yaml").read_text(encoding="utf-8")
        text = text.replace(f"name: {template.name}\n", f"name: {name}\n")
        text = text.replace(
            f"kubernetes.io/hostname: {template.name}\n", f"kubernetes.io/hostname: {name}\n"
        )
        if gpus:
            text = _with_gpu_count(text, gpus)
        (target / name / "node.yaml").write_text(text, encoding="utf-8")
        names.append(name)
    return names


def _with_gpu_count(text: str, gpus: int) -> str:
    """node.yaml's GPU count (nvidia-smi's and the GPU Feature Discovery label) set to `gpus`."""
    text = re.sub(r"(?m)^(  nvidia\.com/gpu\.count: )'\d+'$", rf"\g<1>'{gpus}'", text)
    return re.sub(r"(?m)^(  count: )\d+$", rf"\g<1>{gpus}", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--source", type=Path, default=EXAMPLES)
    parser.add_argument(
        "--gpu-counts",
        default="",
        metavar="N,N,...",
        help="pools of each example node with these GPU counts, in blocks of names",
    )
    args = parser.parse_args()
    gpu_counts = tuple(int(n) for n in args.gpu_counts.split(",") if n)
    generate_fleet(args.directory, args.count, args.source, gpu_counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
