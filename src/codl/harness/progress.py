"""Progress lines of one rank's step loop: step k of n, steps/s and samples/s, in the run's log.

A line is logged after a step's span has closed and its OS sample is taken, never inside a
measured step, and at most one every ``every_s`` seconds (plus the first step, the last warm-up
step and the last step), so a 1,000-step run writes a handful of lines, not a thousand.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# Often enough that a person watching a terminal or `tail -f` on the run log sees it move;
# rarely enough that the log stays readable for runs of hours.
EVERY_S = 10.0


@dataclass
class StepProgress:
    """Counts steps of one rank and logs a progress line now and then."""

    rank: int
    world: int
    total: int
    warmup: int
    batch: int
    every_s: float = EVERY_S
    _t_start: float = field(default_factory=time.monotonic)
    _t_last: float = 0.0
    _step_last: int = -1

    def __post_init__(self) -> None:
        self._t_last = self._t_start

    def due(self, step: int, now: float) -> bool:
        """Whether ``step`` (0-based, just finished) gets a line at time ``now``."""
        edges = {0, self.warmup - 1, self.total - 1}
        return step in edges or now - self._t_last >= self.every_s

    def step_done(self, step: int, now: float | None = None) -> str | None:
        """Record that ``step`` finished; returns (and logs) the line when one is due."""
        now = time.monotonic() if now is None else now
        if not self.due(step, now):
            return None
        steps = step - self._step_last
        elapsed = max(now - self._t_last, 1e-9)
        phase = "warm-up" if step < self.warmup else "measured"
        # A mode that neither loads nor computes (comm alone) moves no samples: steps/s only.
        rate = f"{steps / elapsed:.2f} steps/s"
        if self.batch:
            rate += f", {steps * self.batch / elapsed:.1f} samples/s"
        line = (
            f"rank {self.rank}/{self.world}: step {step + 1}/{self.total} ({phase}), {rate} "
            f"over the last {steps} step(s), {now - self._t_start:.1f} s in the loop"
        )
        self._t_last, self._step_last = now, step
        log.info(line)
        return line
