"""The containerd facts: its version, the files under /etc/containerd, its real config dump.

Each is one command and one pure parser, read alike by live probing and by the steps (the
drift check before a write, the verification after the restart, the check of an undo); and
one function decides whether the containerd a step finds is the one the plan was made for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.containerd import ConfigFiles, ContainerdVersion, dump_command, parse_dump
from rollout.containerd.files import CONTAINERD_DIR, DEFAULT_MAIN_PATH
from rollout.containerd.staging import normalise_dump
from rollout.errors import RolloutError
from rollout.fact import CommandFact, ProbeFailed

CONTAINERD_BIN = "containerd"
# Config files are small; anything bigger under /etc/containerd (a stray image, a core dump)
# is not configuration and is not read.
MAX_FILE_BYTES = 1_000_000
# Every regular file in one round trip: path NUL content NUL, ... Config files hold no NUL,
# so splitting on it is exact.
_CAT_SCRIPT = 'for f do printf "%s\\0" "$f"; cat -- "$f"; printf "\\0"; done'
# The same, then each further path given ($4...), wherever it lies and whatever its size:
# absent is left out, a file (or a link to one) is read, anything else is an error.
_CAT_ALSO_SCRIPT = (
    'd=$1 max=$2 cat=$3; shift 3; find "$d" -type f -size "-${max}c" -exec sh -c "$cat" sh {} + '
    '|| exit 1; for f do if [ -f "$f" ]; then sh -c "$cat" sh "$f" || exit 1; '
    'elif [ -e "$f" ]; then echo "$f is not a regular file" >&2; exit 1; fi; done'
)


class ContainerdChanged(RolloutError):
    """The node runs another containerd than the plan was made for."""


@dataclass(frozen=True)
class ContainerdVersionFact(CommandFact[ContainerdVersion]):
    """`containerd --version` -> ContainerdVersion."""

    binary: str = CONTAINERD_BIN
    sentence = "read the containerd version"
    parser = staticmethod(ContainerdVersion.from_output)

    def command(self) -> list[str]:
        return [self.binary, "--version"]


@dataclass(frozen=True)
class ConfigFilesFact(CommandFact[ConfigFiles]):
    """Every file under /etc/containerd (find + cat, one round trip) -> ConfigFiles.

    The main config must be among them: a node without it is not configured as planned.
    `also`: further files read in the same round trip wherever they lie and whatever their
    size (a step's planned files: a hosts.toml under a config_path outside the directory);
    absent ones are left out.
    """

    main_path: str = DEFAULT_MAIN_PATH
    directory: str = CONTAINERD_DIR
    also: tuple[str, ...] = ()
    sentence = "read {directory}"

    def command(self) -> list[str]:
        if self.also:
            return [
                "sh",
                "-c",
                _CAT_ALSO_SCRIPT,
                "rollout-read",
                self.directory,
                str(MAX_FILE_BYTES),
                _CAT_SCRIPT,
                *self.also,
            ]
        return [
            "find",
            self.directory,
            "-type",
            "f",
            "-size",
            f"-{MAX_FILE_BYTES}c",
            "-exec",
            "sh",
            "-c",
            _CAT_SCRIPT,
            "sh",
            "{}",
            "+",
        ]

    def parse(self, text: str, host: str) -> ConfigFiles:
        files = parse_file_dump(text)
        if self.main_path not in files:
            raise ProbeFailed(
                f"{host}: {self.main_path} not found; is containerd configured there?"
            )
        return ConfigFiles(main_path=self.main_path, files=files)


@dataclass(frozen=True)
class ConfigDumpFact(CommandFact[dict[str, Any]]):
    """containerd's real `config dump` of the node's files, run from `/` as systemd runs it.

    Parsed without `imports` (1.x prints the resolved paths in map order, which changes from
    run to run), so two dumps of the same files compare equal.
    """

    main_path: str = DEFAULT_MAIN_PATH
    binary: str = CONTAINERD_BIN
    sentence = "containerd config dump of {main_path}"

    def command(self) -> list[str]:
        return dump_command(self.binary, self.main_path)

    def parse(self, text: str, host: str) -> dict[str, Any]:
        # The real files are not staged: there is no stage prefix to strip, only `imports`.
        return normalise_dump(parse_dump(text, host), "")


def parse_file_dump(text: str) -> dict[str, str]:
    """`path NUL content NUL ...` (the files fact's output) -> {path: content}, sorted."""
    parts = text.split("\0")
    if parts and parts[-1] == "":
        parts.pop()
    if len(parts) % 2:
        raise ProbeFailed(f"file listing ends inside a record ({len(parts)} fields)")
    return dict(sorted(zip(parts[0::2], parts[1::2], strict=True)))


def check_containerd_version(planned: str | ContainerdVersion, found: ContainerdVersion) -> None:
    """Raise ContainerdChanged, naming both versions, unless `found` is the planned release.

    `planned` is the plan's (NodePlan.containerd_version, `1.7.24`), never facts gathered
    again since: a resumed run compares the node with what was planned and shown.
    """
    want = planned if isinstance(planned, ContainerdVersion) else _planned_version(planned)
    if (found.major, found.minor, found.patch) != (want.major, want.minor, want.patch):
        raise ContainerdChanged(
            f"containerd changed since the plan: {found} now, {want} planned; nothing was "
            "changed by this step: run `rollout plan` again and review the new plan"
        )


def _planned_version(text: str) -> ContainerdVersion:
    try:
        return ContainerdVersion.from_series(text.strip())
    except RolloutError as exc:
        raise ContainerdChanged(
            f"the plan records no usable containerd version ({text!r}): {exc}"
        ) from exc


def parse_mtimes(text: str) -> dict[str, float]:
    """`find -printf '%T@ %p\\n'` output -> {path: mtime}; unreadable lines are skipped."""
    times: dict[str, float] = {}
    for line in text.splitlines():
        stamp, _, path = line.partition(" ")
        try:
            times[path] = float(stamp)
        except ValueError:
            continue
    return dict(sorted(times.items()))


@dataclass(frozen=True)
class ConfigMtimesFact(CommandFact[dict[str, float]]):
    """When each file under /etc/containerd last changed (seconds since the epoch, UTC).

    Compared with containerd's ActiveEnterTimestamp: a file changed after containerd started
    is not loaded yet, and the next restart will load it.
    """

    directory: str = CONTAINERD_DIR
    optional = True
    sentence = "read the modification times under {directory}"
    parser = staticmethod(parse_mtimes)

    def command(self) -> list[str]:
        return ["find", self.directory, "-type", "f", "-printf", "%T@ %p\\n"]
