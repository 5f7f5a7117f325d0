"""Tests only: `rollout` in a lab Job pod whose CronJob runs on a scaled clock.

A test moves the lab's schedule clock ahead and speeds it up (cronjobs.ScaledClock), so
that maintenance windows a day apart come seconds apart. The pod's run must then see the
same time where it asks whether the window is open, or it would judge a window of the
lab's clock by the wall clock. jobpods.py runs such a pod as `python -m
rollout.lab.simulation.podclock ARGS` with the clock in $ROLLOUT_LAB_POD_CLOCK: the very
`rollout` command, its executor given that clock (the window logic is production's, only
its notion of now moves). Without the variable it is plain `rollout`.
"""

from __future__ import annotations

import functools
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

POD_CLOCK_ENV = "ROLLOUT_LAB_POD_CLOCK"
# where a pod finds the lab's clock file (ScaledClock.mirror), mounted read-only
POD_CLOCK_DIR = "/run/rollout-lab-clock"


def main() -> int:
    from rollout.cli import apply
    from rollout.cli import main as rollout_main
    from rollout.executor import Executor
    from rollout.lab.simulation.cronjobs import ScaledClock

    text = os.environ.pop(POD_CLOCK_ENV, "")
    if text:
        # the clock itself, or the file the lab keeps it in while a test moves it
        mirror = Path(text) if text.startswith("/") else None
        fixed = None if mirror else ScaledClock.from_text(text)

        def now() -> datetime:
            clock = fixed or ScaledClock.from_text(Path(str(mirror)).read_text())
            return datetime.fromtimestamp(clock(), UTC)

        # cli/apply.py makes its Executor by this name
        setattr(apply, "Executor", functools.partial(Executor, clock=now))  # noqa: B010
    return rollout_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
