"""`rollout init [DIR]`: the examples shipped in the package (rollout/examples: plans, an
inventory in each format rollout reads, recorded facts), written into DIR to start from."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

from rollout.cli import add_listed_command
from rollout.errors import BadInput, ExitCode

HELP = """\
Write starter files into DIR (default: the current directory): plan.yaml (a registry mirror
for every GPU node), the lab's plans, an inventory in each format rollout reads
(inventory/example.yaml: rollout's own; inventory/example.ini and
inventory/example-ansible.yaml: Ansible INI and YAML) and facts/, recorded facts of four
nodes on containerd 1.6, 1.7 and 2.1 to try `rollout plan --facts` and `rollout diagnose
--facts` on without a cluster. Refuses to overwrite a file unless --force.
"""

EPILOG = """\
examples:
  rollout init starter && cd starter
  rollout plan plan.yaml --facts facts
"""

FACTS = "facts"


@dataclass(frozen=True)
class StarterFile:
    """A file `rollout init` writes: where, relative to DIR, and its bytes."""

    path: PurePosixPath
    content: bytes

    @property
    def summary(self) -> str:
        """The file's first comment line: what it is."""
        first = self.content.decode(errors="replace").splitlines()[:1]
        if not first or first[0][:1] not in "#;":
            return ""
        return first[0].lstrip("#; ").rstrip(" .,")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "init", HELP, EPILOG, as_written=True)
    parser.add_argument(
        "directory",
        metavar="DIR",
        nargs="?",
        type=Path,
        default=Path("."),
        help="where to write (created if missing; default: the current directory)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite files that exist")
    parser.set_defaults(func=run_init)


def run_init(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    files = starter_files()
    existing = [f.path.as_posix() for f in files if (directory / f.path).exists()]
    if existing and not args.force:
        raise BadInput(
            f"{directory}: {len(existing)} of the starter files exist already "
            f"({', '.join(existing[:5])}{', ...' if len(existing) > 5 else ''}); "
            "nothing was written: pass --force to overwrite them, or name another DIR"
        )
    try:
        for starter in files:
            target = directory / starter.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(starter.content)
    except OSError as exc:
        raise BadInput(f"{directory}: cannot write the starter files: {exc}") from exc
    print(describe_written(directory, files))
    return ExitCode.OK


def starter_files() -> list[StarterFile]:
    """Every file of the package's examples, in path order."""
    found: list[StarterFile] = []

    def walk(node: Traversable, path: PurePosixPath) -> None:
        for child in node.iterdir():
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, path / child.name)
            else:
                found.append(StarterFile(path / child.name, child.read_bytes()))

    walk(resources.files("rollout") / "examples", PurePosixPath())
    # plan.yaml, the starter, first; then the other plans, the inventories and the facts
    return sorted(found, key=lambda f: (len(f.path.parts), f.path.name != "plan.yaml", f.path))


def describe_written(directory: Path, files: list[StarterFile]) -> str:
    """What was written, one line a file (the recorded facts as one line), and what next."""
    described = [f for f in files if f.path.parts[0] != FACTS]
    nodes = sorted({f.path.parts[1] for f in files if f.path.parts[0] == FACTS})
    width = max(len(f.path.as_posix()) for f in described)
    lines = [f"wrote {len(files)} files into {directory}:"]
    lines += [f"  {f.path.as_posix():<{width}}  {f.summary}".rstrip() for f in described]
    lines.append(
        f"  {FACTS + '/':<{width}}  recorded facts of {len(nodes)} nodes ({', '.join(nodes)})"
    )
    where = "" if directory == Path(".") else f"  cd {directory}\n"
    lines.append(
        "next:\n"
        f"{where}"
        "  rollout plan plan.yaml --facts facts         # what the plan would change, no cluster\n"
        "  rollout diagnose --facts facts               # why a node's GPUs are not advertised\n"
        '  rollout schedule plan.yaml -i inventory/example.yaml --cron "0 22 * * fri" \\\n'
        "      --image REPOSITORY@sha256:DIGEST         # the manifests of scheduled waves\n"
        "  then list your nodes in inventory/example.yaml and run\n"
        "  rollout plan plan.yaml -i inventory/example.yaml"
    )
    return "\n".join(lines)
