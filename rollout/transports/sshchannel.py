"""One command's exchange over an open SSH channel: stdin in, stdout and stderr out, the
exit status, all within a deadline."""

from __future__ import annotations

import contextlib
import select
import threading
import time

import paramiko

CHUNK_BYTES = 32768


def exchange(
    channel: paramiko.Channel, stdin: bytes | None, deadline: float
) -> tuple[int, bytes, bytes] | None:
    """Stream stdin in, collect stdout/stderr and the exit status; None past the deadline.

    stdin goes from its own thread: a command that writes more than the SSH window before
    reading its input would otherwise deadlock against us.
    """
    feeder = threading.Thread(target=_feed_stdin, args=(channel, stdin), daemon=True)
    feeder.start()
    stdout, stderr = bytearray(), bytearray()
    # channel.fileno() turns readable on data for either stream and on EOF/close.
    while not (channel.eof_received or channel.closed):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        select.select([channel], [], [], remaining)
        _drain(channel, stdout, stderr)
    if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
        return None
    _drain(channel, stdout, stderr)
    feeder.join(timeout=1.0)
    return channel.recv_exit_status(), bytes(stdout), bytes(stderr)


def _drain(channel: paramiko.Channel, stdout: bytearray, stderr: bytearray) -> None:
    """Read what is buffered, without blocking."""
    while channel.recv_ready():
        stdout += channel.recv(CHUNK_BYTES)
    while channel.recv_stderr_ready():
        stderr += channel.recv_stderr(CHUNK_BYTES)


def _feed_stdin(channel: paramiko.Channel, data: bytes | None) -> None:
    """Send all of stdin, then EOF; a command that exits without reading it is no error."""
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        if data:
            channel.sendall(data)
        channel.shutdown_write()
