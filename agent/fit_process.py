"""The fit process's entry point (`agent.refits.FitWorker` spawns it): lower the priority
first, then import what fits need.

Importing torch and BoTorch takes seconds of a core. Done before the priority drops, as it was,
that import ran at the agent's own priority right as the service started — when a restarted
agent drains what its broker queued meanwhile — and took a core from the event loop. This
module imports nothing heavy, so the child spawned with it as the target is at FIT_NICENESS
before the first heavy import.
"""

from __future__ import annotations

import contextlib
import os
from multiprocessing.connection import Connection

__all__ = ["FIT_NICENESS", "main"]

# The fit process yields the CPU to the agent: a fit runs for seconds to minutes, a reading
# must be learned in milliseconds. Measured (`bench latency`, 2 cores shared with other work):
# with the fit at the agent's priority the loop fell behind at 100 readings/s in 2 of 3 long
# windows, its latency growing to seconds; a fit that waits only gets its new values later.
FIT_NICENESS = 10


def main(conn: Connection, parent: int) -> None:
    """Run at FIT_NICENESS, then serve fits (`agent.refits.serve_fits`) until told to stop."""
    with contextlib.suppress(OSError):
        os.nice(FIT_NICENESS)
    from agent.refits import serve_fits

    serve_fits(conn, parent)
