"""ops's one exception root, as the coordinator has `CoordinatorError`: every problem
a tool raises on purpose is an `OpsError` that says itself in one line, with the exit
status it means. `ops.main.run` maps them to stderr and the exit status in exactly one
place; anything else is a bug and shows its traceback."""

from __future__ import annotations

from typing import ClassVar


class OpsError(Exception):
    """A problem the user can act on: exit 1 unless the subclass says otherwise."""

    exit_code: ClassVar[int] = 1
    # Who says it on stderr (`gpufleet: …`, `gpufleet nats-auth: …`).
    prog: ClassVar[str] = "gpufleet"

    def one_line(self) -> str:
        return str(self)
