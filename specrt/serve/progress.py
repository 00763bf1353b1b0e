"""Is the engine making progress? A health check's question: work is queued or running and the engine's
progress counter (scheduler rounds, or tokens received from remote engines) has not moved for `stall_s`
seconds. Shared by `specrt serve`'s /health and the Ray replicas' health checks."""

from __future__ import annotations

import time

STALL_S = 60.0


class Progress:
    def __init__(self, stall_s: float = STALL_S):
        self.stall_s = stall_s
        self._last = (0, time.monotonic())

    def stalled_for(self, counter: int, busy: bool) -> float | None:
        """Seconds without progress while busy, once they pass `stall_s`; None while all is well."""
        last, since = self._last
        now = time.monotonic()
        if counter != last or not busy:
            self._last = (counter, now)
            return None
        return now - since if now - since > self.stall_s else None
