"""Recorded files: a node's `files/` directory read into node path -> text.

Part of the recorded-facts layout (rollout.facts.recorded): only regular UTF-8 files of at
most MAX_FILE_BYTES, and symlinks to such files inside the node's own `files/`, are read;
everything else is an error naming the node and the path. A fleet is tens of thousands of
files, so the walk works on directory entries and strings, and the common case of a file
is read without rollout.inputs.inputfile's checks that its directory entry already answered.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from rollout.errors import InputError, InputErrors, SourceLocation
from rollout.facts.containerd import MAX_FILE_BYTES
from rollout.facts.model import NodeFactsError
from rollout.inputs.fieldproblems import describe_value
from rollout.inputs.inputfile import read_text
from rollout.memo import ValueTable

# Control characters have no place in a node-side path; a newline in one would forge lines
# of rollout's own output.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def read_recorded_files(root: str | os.PathLike[str], node: str) -> dict[str, str]:
    """Every recorded file under `root`, as node path -> text; refuses what is not config.

    Only regular files (or symlinks to regular files inside `root`) of valid UTF-8 and at
    most MAX_FILE_BYTES are read (by rollout.inputs.inputfile, as every input file); anything else
    is an error naming the node and the path.
    """
    walk = _Walk(os.fspath(root), node)
    # paths as strings and directory entries' own types: a fleet is tens of thousands of
    # files, and pathlib's parsing or a stat of each cost more than reading it
    if not walk.visit(walk.root, ""):
        return {}  # no directory there (Path.is_dir's answer, without a stat of its own)
    if walk.errors:
        raise InputErrors(walk.errors)
    return walk.files


class _Walk:
    """One node's recorded files, read as os.walk visits them (top-down, in listing order).

    A class rather than nested functions: a recursive closure is a reference cycle, and a
    fleet's ten thousand of them kept the garbage collector busy.
    """

    def __init__(self, root: str, node: str) -> None:
        self.root = root
        self.node = node
        self.files: dict[str, str] = {}
        self.errors: list[InputError] = []

    def visit(self, directory: str, below: str) -> bool:
        """Read `directory`; False, and nothing read, when it is not a directory at all."""
        node, errors = self.node, self.errors
        dirs: list[os.DirEntry[str]] = []
        others: list[os.DirEntry[str]] = []
        try:
            with os.scandir(directory) as listing:
                for entry in listing:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else others).append(entry)
        except OSError as exc:
            if not below and exc.errno in _NOT_A_DIRECTORY:
                return False
            where = SourceLocation(str(exc.filename or self.root))
            errors.append(NodeFactsError(node, where, f"cannot read: {exc.strerror or exc}"))
            return True
        for entry in sorted(dirs, key=_entry_name):
            if entry.is_symlink():
                errors.append(
                    NodeFactsError(
                        node,
                        SourceLocation(entry.path),
                        "a symlink to a directory; record the directory's files themselves",
                    )
                )
        if len(others) > 1:
            others.sort(key=_entry_name)
        files = self.files
        for entry in others:
            node_path = f"{below}/{entry.name}"
            try:
                if CONTROL_CHARACTERS.search(node_path):
                    raise InputError(
                        SourceLocation(entry.path),
                        f"the file name holds a control character: {describe_value(node_path)}",
                    )
                files[node_path] = _read_recorded_file(entry, self.root)
            except InputError as exc:
                errors.append(for_node(node, exc))
        for entry in dirs:  # os.walk's order: the listing's
            if not entry.is_symlink():
                self.visit(entry.path, f"{below}/{entry.name}")
        return True


# What Path.is_dir answers False to rather than raise: no directory there to read.
_NOT_A_DIRECTORY = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def _entry_name(entry: os.DirEntry[str]) -> str:
    return entry.name


# Recorded fleets repeat a few configurations many times (the toolkit writes byte-identical
# drop-ins across a node pool): one string per distinct text, shared by every node holding it
# (a plain table: a lock and LRU order per file cost more than the file's read).
_TEXTS: ValueTable[str] = ValueTable(str, 4096)


def _read_recorded_file(entry: os.DirEntry[str], root: str) -> str:
    if not entry.is_symlink():
        # the walk does not follow directory links and reports them (read_recorded_files), so
        # a plain file under the root is inside it: no path to resolve
        text = read_plain_text(entry.path, MAX_FILE_BYTES)
        if text is None:
            text = read_text(Path(entry.path), max_bytes=MAX_FILE_BYTES)
        return _TEXTS.get(text)
    local = Path(entry.path)
    where = SourceLocation(str(local))
    try:
        target = local.resolve(strict=True)
    except RuntimeError as exc:
        raise InputError(where, "a symlink loop") from exc
    except OSError as exc:
        raise InputError(where, f"a symlink to nothing ({exc.strerror or exc})") from exc
    if not target.is_relative_to(Path(root).resolve()):
        # a link out of the facts could carry any file of this machine into a plan's diff
        raise InputError(
            where,
            f"a symlink out of the node's recorded files (to {target})",
            hint="record a copy of the file itself",
        )
    return read_text(local, max_bytes=MAX_FILE_BYTES)


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW


def read_plain_text(local: str, max_bytes: int) -> str | None:
    """The UTF-8 text of a regular file of at most max_bytes, or None for anything else.

    The common case of rollout.inputs.inputfile.read_text at a quarter of its cost (a fleet is tens
    of thousands of files): None (a link, a FIFO or device, too large, not UTF-8, any error)
    leaves the file to read_text, which refuses it in its own words. Opened without following
    a link and without blocking, and checked to be a regular file before it is read.
    """
    try:
        fd = open_plain(local)
    except OSError:
        return None
    return read_open_text(fd, max_bytes)


def open_plain(local: str) -> int:
    """A file descriptor for read_open_text: `local` opened without following a link and
    without blocking; OSError as os.open raises it."""
    return os.open(local, _OPEN_FLAGS)


def read_open_text(fd: int, max_bytes: int) -> str | None:
    """read_plain_text of a file open_plain opened; closes `fd`."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        # the size it has, and a byte more to see its end: one read of a buffer that small
        # (a max_bytes buffer costs the allocator a map and an unmap per file)
        data = os.read(fd, info.st_size + 1)
        if len(data) == info.st_size:
            return data.decode("utf-8")
        chunks: list[bytes] = [data]
        size = len(data)
        while data and size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            return None
        return b"".join(chunks).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def for_node(node: str, error: InputError) -> InputError:
    """The error as one of `node`'s (NodeFactsError), unless it already is."""
    if isinstance(error, NodeFactsError):
        return error
    return NodeFactsError(node, error.location, error.message, field=error.field, hint=error.hint)
