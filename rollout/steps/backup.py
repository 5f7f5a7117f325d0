"""Files on a node: read, back up, replace atomically, restore byte for byte (invariant 6).

Every operation is one fixed shell script run with the data as positional arguments and the
content on stdin, so no path or byte of content is ever parsed by a shell. Bytes are copied
on the node (`cp -p`) rather than through this machine, so a backup keeps the original's
exact bytes, mode and owner even where they are not UTF-8; sha256 sums computed on the node
prove each copy.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from rollout.commands import CommandRunner, check
from rollout.errors import RolloutError

BACKUP_ROOT = "/var/lib/rollout/backups"
NEW_FILE_MODE = "0644"
NEW_FILE_OWNER = "root:root"

# path NUL flag NUL content NUL, flag 1 (exists) or 0 (absent, content empty)
_READ_SCRIPT = (
    'for f do if [ -e "$f" ]; then printf "%s\\0%s\\0" "$f" 1; cat -- "$f" || exit 1; '
    'printf "\\0"; else printf "%s\\0%s\\0\\0" "$f" 0; fi; done'
)
# $1 original, $2 backup; the copy lands under a temporary name first, so a backup path
# never holds a partial copy. Prints the two sums: original, then backup.
_BACKUP_SCRIPT = (
    'set -e; mkdir -p -- "$(dirname -- "$2")"; cp -p -- "$1" "$2.partial"; '
    'sync -- "$2.partial"; mv -f -- "$2.partial" "$2"; sync -- "$(dirname -- "$2")"; '
    'sha256sum -- "$1" "$2"'
)
# $1 target, $2 mode, $3 owner (both used only for a new file), $4 the content's sha256;
# content on stdin. The temp file sits in the target's directory so `mv` is a rename, atomic
# on one filesystem. A transfer cut short (rollout killed mid-write: `cat` sees an early end
# of input and exits 0) fails the sum check and replaces nothing.
_REPLACE_SCRIPT = (
    'set -e; dir=$(dirname -- "$1"); mkdir -p -- "$dir"; '
    'tmp=$(mktemp "$dir/.rollout.XXXXXXXXXX"); trap \'rm -f -- "$tmp"\' EXIT; '
    'cat > "$tmp"; '
    'sum=$(sha256sum < "$tmp"); [ "${sum%% *}" = "$4" ] || '
    '{ echo "rollout-write: $1: the text arrived incomplete, nothing replaced" >&2; exit 3; }; '
    'if [ -e "$1" ]; then chmod --reference="$1" -- "$tmp"; chown --reference="$1" -- "$tmp"; '
    'else chmod "$2" -- "$tmp"; chown "$3" -- "$tmp"; fi; '
    'sync -- "$tmp"; mv -f -- "$tmp" "$1"; trap - EXIT; sync -- "$dir"; sha256sum -- "$1"'
)
# $1 backup, $2 target: the backup's bytes, mode and owner back in place, atomically.
_RESTORE_SCRIPT = (
    'set -e; dir=$(dirname -- "$2"); mkdir -p -- "$dir"; '
    'tmp=$(mktemp "$dir/.rollout.XXXXXXXXXX"); trap \'rm -f -- "$tmp"\' EXIT; '
    'cp -p -- "$1" "$tmp"; sync -- "$tmp"; mv -f -- "$tmp" "$2"; trap - EXIT; '
    'sync -- "$dir"; sha256sum -- "$2"'
)
# $1 backup, $2 target another writer also owns (the toolkit's drop-in): put back only over
# a file still there, and read what is there afterwards without failing, since the other
# writer may delete or rewrite it at any instant. Prints `absent` or the target's sum.
_RESTORE_SHARED_SCRIPT = (
    'set -e; [ -e "$2" ] || { echo absent; exit 0; }; dir=$(dirname -- "$2"); '
    'tmp=$(mktemp "$dir/.rollout.XXXXXXXXXX"); trap \'rm -f -- "$tmp"\' EXIT; '
    'cp -p -- "$1" "$tmp"; sync -- "$tmp"; mv -f -- "$tmp" "$2"; trap - EXIT; '
    'sync -- "$dir"; sha256sum -- "$2" 2>/dev/null || echo absent'
)
_MISSING_DIRS_SCRIPT = 'for d do [ -d "$d" ] || printf "%s\\n" "$d"; done'


class NodeFileError(RolloutError):
    """A file operation on a node failed or could not be proven."""


@dataclass(frozen=True)
class BackupRecord:
    """Where one original file was copied on the node, and the sha256 of its bytes."""

    path: str
    backup_path: str
    sha256: str


def sha256_text(text: str) -> str:
    """The sha256 of text as written to a node (UTF-8)."""
    return hashlib.sha256(text.encode()).hexdigest()


def backup_path_for(run_id: str, path: str) -> str:
    """`/var/lib/rollout/backups/<run-id>/<path>`: one tree per run, mirroring the node's."""
    if "/" in run_id or run_id in {"", ".", ".."}:
        raise NodeFileError(f"a run id cannot name a directory: {run_id!r}")
    return posixpath.join(BACKUP_ROOT, run_id, path.lstrip("/"))


def read_node_files(runner: CommandRunner, paths: Sequence[str]) -> dict[str, str | None]:
    """The current text of each path on the node (None: absent), in one round trip."""
    if not paths:
        return {}
    result = check(
        runner.run(["sh", "-c", _READ_SCRIPT, "rollout-read", *paths]),
        f"read {', '.join(paths)}",
    )
    return parse_node_files(result.stdout)


def parse_node_files(text: str) -> dict[str, str | None]:
    """`path NUL flag NUL content NUL ...` -> {path: content or None when absent}."""
    parts = text.split("\0")
    if parts and parts[-1] == "":
        parts.pop()
    if len(parts) % 3:
        raise NodeFileError(f"file listing ends inside a record ({len(parts)} fields)")
    files: dict[str, str | None] = {}
    for path, flag, content in zip(parts[0::3], parts[1::3], parts[2::3], strict=True):
        if flag not in {"0", "1"}:
            raise NodeFileError(f"file listing has a bad existence flag {flag!r} for {path}")
        files[path] = content if flag == "1" else None
    return files


def find_missing_dirs(runner: CommandRunner, dirs: Sequence[str]) -> list[str]:
    """The directories among `dirs` that do not exist on the node."""
    if not dirs:
        return []
    result = check(
        runner.run(["sh", "-c", _MISSING_DIRS_SCRIPT, "rollout-dirs", *dirs]),
        "look for missing directories",
    )
    return [line for line in result.stdout.splitlines() if line]


def back_up_file(runner: CommandRunner, path: str, backup_path: str) -> BackupRecord:
    """Copy `path` to `backup_path` on the node (mode and owner kept), proven by sha256."""
    result = check(
        runner.run(["sh", "-c", _BACKUP_SCRIPT, "rollout-backup", path, backup_path]),
        f"back up {path} to {backup_path}",
    )
    sums = parse_sha256sum(result.stdout)
    original, copy = sums.get(path), sums.get(backup_path)
    if original is None or original != copy:
        raise NodeFileError(
            f"{runner.host}: the backup {backup_path} does not match {path} "
            f"(sha256 {original} vs {copy}); nothing was replaced"
        )
    return BackupRecord(path, backup_path, original)


def replace_file(runner: CommandRunner, path: str, text: str) -> str:
    """Write `text` to `path` atomically (temp file, fsync, rename); returns the new sha256.

    An existing file keeps its mode and owner; a new one is 0644 root:root.
    """
    data = text.encode()
    expected = hashlib.sha256(data).hexdigest()
    result = check(
        runner.run(
            [
                "sh",
                "-c",
                _REPLACE_SCRIPT,
                "rollout-write",
                path,
                NEW_FILE_MODE,
                NEW_FILE_OWNER,
                expected,
            ],
            stdin=data,
        ),
        f"write {path}",
    )
    written = parse_sha256sum(result.stdout).get(path)
    if written != expected:
        raise NodeFileError(
            f"{runner.host}: {path} holds sha256 {written} after the write, not {expected}"
        )
    return expected


def restore_file(runner: CommandRunner, backup: BackupRecord) -> None:
    """Put the backup's bytes back at the original path, proven by its recorded sha256."""
    result = check(
        runner.run(
            ["sh", "-c", _RESTORE_SCRIPT, "rollout-restore", backup.backup_path, backup.path]
        ),
        f"restore {backup.path} from {backup.backup_path}",
    )
    restored = parse_sha256sum(result.stdout).get(backup.path)
    if restored != backup.sha256:
        raise NodeFileError(
            f"{runner.host}: {backup.path} holds sha256 {restored} after restoring "
            f"{backup.backup_path}, not the original's {backup.sha256}; "
            "the backup is damaged: compare it by hand before restarting containerd"
        )


class SharedRestore(Enum):
    """How restoring a file another writer co-owns ended."""

    RESTORED = "restored byte for byte"
    REMOVED = "removed by its other writer (left absent)"
    REWRITTEN = "rewritten by its other writer since the restore"


def restore_shared_file(runner: CommandRunner, backup: BackupRecord) -> SharedRestore:
    """Put the backup back over a file another writer also owns, unless that writer has
    removed it; what the file holds afterwards is that writer's to decide, so a change
    after the restore is an outcome, not an error (the caller judges what containerd loads)."""
    result = check(
        runner.run(
            ["sh", "-c", _RESTORE_SHARED_SCRIPT, "rollout-restore", backup.backup_path, backup.path]
        ),
        f"restore {backup.path} from {backup.backup_path}",
    )
    if result.stdout.strip() == "absent":
        return SharedRestore.REMOVED
    restored = parse_sha256sum(result.stdout).get(backup.path)
    return SharedRestore.RESTORED if restored == backup.sha256 else SharedRestore.REWRITTEN


def sha256_of_files(runner: CommandRunner, paths: Sequence[str]) -> dict[str, str]:
    """sha256 of each existing path on the node (absent paths are left out)."""
    if not paths:
        return {}
    # sha256sum exits 1 when a path is missing but still prints the others' sums
    result = runner.run(["sha256sum", "--", *paths])
    return parse_sha256sum(result.stdout)


def remove_file(runner: CommandRunner, path: str) -> None:
    """Delete a file rollout created (absent already is fine)."""
    check(runner.run(["rm", "-f", "--", path]), f"remove {path}")


def remove_empty_dirs(runner: CommandRunner, dirs: Sequence[str]) -> None:
    """Remove directories rollout created, deepest first, only where they are empty."""
    ordered = sorted(dirs, key=lambda d: d.count("/"), reverse=True)
    if ordered:
        # Not checked: a directory someone else filled in the meantime stays.
        runner.run(["rmdir", "--ignore-fail-on-non-empty", "--", *ordered])


def parse_sha256sum(text: str) -> dict[str, str]:
    """`sha256sum` output -> {path: hex digest}."""
    sums: dict[str, str] = {}
    for line in text.splitlines():
        digest, sep, path = line.partition("  ")
        if sep and len(digest) == 64:
            sums[path] = digest
    return sums
