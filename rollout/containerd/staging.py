"""Run the real `containerd config dump` on staged copies of config files, via a CommandRunner.

Staging works on any machine a CommandRunner reaches (the node over SSH, or this machine):
one `mktemp -d`, one `tar -x` of an archive built here and sent on stdin, then `config dump`
per file set, then `rm -rf` of the staging directory whatever happened. Every file sits at
<stage>/<set>/<absolute path>, so relative imports keep working; absolute `imports` entries
are rewritten to point into the stage. containerd runs with the set's root as its working
directory, because 1.6 resolves relative globs against it (`/` under systemd).

A process killed while staging cannot remove its directory, so a staging directory may be
named after its owner (a run): `rollout-containerd.<owner>.XXXXXXXXXX` in the node's temp
directory. The owner finds its own leftovers with `remove_stages` and never touches another
owner's.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
from collections.abc import Sequence
from typing import Any

import tomlkit

from rollout.commands import CommandRunner, check
from rollout.containerd.dump import dump_command, parse_dump
from rollout.containerd.errors import StagingFailed
from rollout.containerd.files import ConfigFiles

DUMP_TIMEOUT_S = 60.0
STAGE_PREFIX = "rollout-containerd"
_OWNER = re.compile(r"[A-Za-z0-9_-]+")
# $1 the owner; the glob stays outside quotes, the owner inside: no name is parsed as a glob.
# `${TMPDIR:-/tmp}` is where `mktemp -t` puts the directories.
_REMOVE_STAGES_SCRIPT = f'rm -rf -- "${{TMPDIR:-/tmp}}/{STAGE_PREFIX}.$1."*'


def dump_configs(
    runner: CommandRunner,
    containerd_bin: str,
    file_sets: Sequence[ConfigFiles],
    *,
    owner: str = "",
) -> list[dict[str, Any]]:
    """The normalised `config dump` of each file set, staged together in one temp dir.

    `owner` (a run id) names the staging directory, for `remove_stages` after a kill.
    """
    made = check(
        runner.run(["mktemp", "-d", "-t", stage_template(owner)]),
        "create a staging directory for containerd config files",
    )
    stage = made.stdout.strip()
    if not stage.startswith("/"):
        raise StagingFailed(f"mktemp on {runner.host} printed no absolute path: {stage!r}")
    try:
        roots = [posixpath.join(stage, str(i)) for i in range(len(file_sets))]
        archive = build_staging_tar(list(zip(roots, file_sets, strict=True)), stage)
        check(
            runner.run(["tar", "-x", "-C", stage, "-f", "-"], stdin=archive),
            f"unpack staged containerd config files into {stage}",
        )
        dumps = []
        for root, files in zip(roots, file_sets, strict=True):
            result = runner.run(
                dump_command(containerd_bin, root + files.main_path, workdir=root),
                timeout_s=DUMP_TIMEOUT_S,
            )
            check(result, f"containerd config dump of staged {files.main_path}")
            tree = parse_dump(result.stdout, runner.host)
            dumps.append(normalise_dump(tree, root))
        return dumps
    finally:
        runner.run(["rm", "-rf", "--", stage])


def stage_template(owner: str = "") -> str:
    """The `mktemp -t` template of a staging directory, with its owner's name when given."""
    if not owner:
        return f"{STAGE_PREFIX}.XXXXXXXXXX"
    if not _OWNER.fullmatch(owner):
        raise StagingFailed(f"a staging owner must be letters, digits, - and _: {owner!r}")
    return f"{STAGE_PREFIX}.{owner}.XXXXXXXXXX"


def remove_stages(runner: CommandRunner, owner: str) -> None:
    """Remove every staging directory `owner` left on the runner's machine (none is fine)."""
    stage_template(owner)  # refuses an owner that is not a plain name
    check(
        runner.run(["sh", "-c", _REMOVE_STAGES_SCRIPT, "rollout-unstage", owner]),
        f"remove the staging directories of {owner}",
    )


def dump_config(runner: CommandRunner, containerd_bin: str, files: ConfigFiles) -> dict[str, Any]:
    """The normalised `config dump` of one file set."""
    return dump_configs(runner, containerd_bin, [files])[0]


def build_staging_tar(sets: Sequence[tuple[str, ConfigFiles]], stage: str) -> bytes:
    """A tar of every set's files, paths relative to `stage`, imports rewritten into the set."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, files in sets:
            rel_root = posixpath.relpath(root, stage)
            added: set[str] = set()
            for path, text in files.files.items():
                member = rel_root + path
                for parent in _parents(member):
                    if parent not in added:
                        added.add(parent)
                        info = tarfile.TarInfo(parent)
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)
                data = stage_text(text, root).encode()
                info = tarfile.TarInfo(member)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def stage_text(text: str, root: str) -> str:
    """The file text with absolute `imports` entries moved under `root`, all else untouched."""
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError:
        return text  # containerd will report the syntax error itself, with the line
    imports = doc.get("imports")
    if not isinstance(imports, list) or not any(
        isinstance(i, str) and i.startswith("/") for i in imports
    ):
        return text
    doc["imports"] = [root + i if isinstance(i, str) and i.startswith("/") else i for i in imports]
    return tomlkit.dumps(doc)


def normalise_dump(tree: dict[str, Any], root: str) -> dict[str, Any]:
    """Drop what depends on staging: `imports` (1.x prints resolved paths) and the stage prefix."""
    out = {k: v for k, v in tree.items() if k != "imports"}
    unstaged: dict[str, Any] = _unstage(out, root)
    return unstaged


def _unstage(value: Any, root: str) -> Any:
    if isinstance(value, dict):
        return {k: _unstage(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_unstage(v, root) for v in value]
    if isinstance(value, str) and value.startswith(root + "/"):
        return value[len(root) :]
    return value


def _parents(member: str) -> list[str]:
    parts = member.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
