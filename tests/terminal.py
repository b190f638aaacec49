"""Running a command as a person would: its stdout and stderr on a pseudo-terminal (so
it sees a TTY and draws tables and colours), read until it closes the terminal."""

from __future__ import annotations

import os
import pty
from collections.abc import Mapping, Sequence


def on_pty(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, bytes]:
    """The exit status and every byte the terminal received, escapes included."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execve(argv[0], list(argv), dict(env))
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)
