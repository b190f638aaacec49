"""The `gpufleet-agent` process entry: first decides what this process leaves out of its
imports (`agent.lean`, for the 40 MB budget), then runs `agent.main`.

`python -m agent.main` still runs the agent, with the libraries' imports as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agent.lean import leave_out_unused_imports

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    leave_out_unused_imports()
    from agent.main import main as agent_main  # after: it imports pydantic and nats-py

    return agent_main(argv)


if __name__ == "__main__":
    sys.exit(main())
