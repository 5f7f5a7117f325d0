"""Reading input files safely: regular files only, bounded in size, UTF-8.

A FIFO given as a plan would block forever, `/dev/zero` would be read until memory runs out,
and a 50 MiB file takes PyYAML half a minute: all are refused here, before any parsing, with
what was found and what is allowed (docs/input-contract.md).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from rollout.errors import InputError, SourceLocation

# `-` in place of a path: standard input (`rollout plan - --facts DIR`), named thus in messages
STDIN_PATH = "-"
STDIN_NAME = "<stdin>"

# The largest input file read: a plan is a few KiB; PyYAML parses about 1.5 MiB a second.
MAX_INPUT_BYTES = 1024 * 1024

_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_regular_file(where: SourceLocation, mode: int, size: int, max_bytes: int) -> None:
    for test, kind in _NOT_REGULAR:
        if test(mode):
            raise InputError(
                where,
                f"is {kind}, not a regular file",
                hint="rollout reads plans, inventories and facts only from regular files",
            )
    if size > max_bytes:
        raise InputError(
            where,
            f"the file is {_size_text(size)}, over the {_size_text(max_bytes)} limit"
            " for an input file",
            hint="see docs/input-contract.md for the limits",
        )


def _size_text(size: int) -> str:
    if size >= 1024 * 1024 and size % (1024 * 1024) == 0:
        return f"{size // (1024 * 1024)} MiB"
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MiB ({size} bytes)"
    return f"{size} bytes"


def input_name(path: Path) -> str:
    """How messages name an input: its path, or `<stdin>` for `-`."""
    return STDIN_NAME if str(path) == STDIN_PATH else str(path)


def read_text(path: Path, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """A regular file's text as UTF-8, at most max_bytes; InputError when it is missing, not
    a regular file (a FIFO would block, /dev/zero never ends), too large or not UTF-8.
    `-` reads standard input, once: a caller keeps the text it needs again."""
    if str(path) == STDIN_PATH:
        return read_stdin(max_bytes=max_bytes)
    where = SourceLocation(str(path))
    try:
        # stat first: opening some devices has effects, and a FIFO would block in open()
        info = os.stat(path)
        check_regular_file(where, info.st_mode, info.st_size, max_bytes)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as stream:
            info = os.fstat(stream.fileno())  # the file may have been swapped since stat()
            check_regular_file(where, info.st_mode, info.st_size, max_bytes)
            data = stream.read(max_bytes + 1)
        if len(data) > max_bytes:
            check_regular_file(where, stat.S_IFREG, len(data), max_bytes)
        return data.decode("utf-8")
    except FileNotFoundError as exc:
        raise InputError(where, "file not found", hint="check the path") from exc
    except IsADirectoryError as exc:
        raise InputError(where, "is a directory, not a file") from exc
    except UnicodeDecodeError as exc:
        raise InputError(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputError(where, f"cannot read: {exc.strerror or exc}") from exc


def read_stdin(*, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """Standard input's text as UTF-8, at most max_bytes (a pipe has no size to check first)."""
    where = SourceLocation(STDIN_NAME)
    try:
        data = sys.stdin.buffer.read(max_bytes + 1)
        if len(data) > max_bytes:
            check_regular_file(where, stat.S_IFREG, len(data), max_bytes)
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputError(where, f"cannot read: {exc.strerror or exc}") from exc
