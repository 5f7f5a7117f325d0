"""Generate a recorded-facts fleet of N nodes by copying the example nodes under new names.

    .venv/bin/python bench/fleet.py DIR N [--source examples/facts]

Node i is a copy of the (i mod 4)th example node, renamed `<example>-<i>` (node.yaml `name:`
and the hostname label rewritten): a fleet of a few distinct node configurations repeated
many times, as a real GPU fleet is (the toolkit writes byte-identical drop-ins per pool).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "facts"


def generate_fleet(target: Path, count: int, source: Path = EXAMPLES) -> list[str]:
    """Write `count` node directories under `target` (emptied first); returns their names."""
    templates = sorted(p for p in source.iterdir() if (p / "node.yaml").is_file())
    if not templates:
        raise SystemExit(f"no node facts under {source}")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    width = len(str(count))
    names = []
    for index in range(count):
        template = templates[index % len(templates)]
        name = f"{template.name}-{index:0{width}d}"
        shutil.copytree(template / "files", target / name / "files")
        text = (template / "node.yaml").read_text(encoding="utf-8")
        text = text.replace(f"name: {template.name}\n", f"name: {name}\n")
        text = text.replace(
            f"kubernetes.io/hostname: {template.name}\n", f"kubernetes.io/hostname: {name}\n"
        )
        (target / name / "node.yaml").write_text(text, encoding="utf-8")
        names.append(name)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--source", type=Path, default=EXAMPLES)
    args = parser.parse_args()
    generate_fleet(args.directory, args.count, args.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
