"""How much of the machine other processes took while we timed: the check that keeps a profile measured
under someone else's load out of the bundle.

A profile stored while another job held the cores is wrong for good (one exported beside a heavy job said
t(1) = 148 ms for the int4 1.5B target and 110 ms for the 0.5B draft, about 30 and 10 ms on the quiet
machine, and auto k never drafted). Timing spread cannot catch it: a steady neighbour makes every round
slow by the same factor. What does catch it is the kernel's account of CPU time: over the measurement, the
busy time of all CPUs (`/proc/stat`: everything but idle and iowait, steal included: a hypervisor's other
guests take cores too) minus this process's own (`/proc/self/stat`), as a share of all CPU time. On a
2-core machine one busy-looping neighbour is 0.5.

Linux only; elsewhere the share is unknown (None) and a profile is kept as measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_SHARE = 0.15  # others took more than this share of all CPU time: the timings are not the machine's
MIN_WINDOW_S = 0.3  # the kernel counts in ticks of 10 ms: a shorter block is watched for this long in all


def _machine() -> tuple[int, int] | None:
    """(all CPU time, idle time) since boot, in clock ticks."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def _own() -> int | None:
    """This process's user + system CPU time since it started, in clock ticks (all its threads)."""
    try:
        after_name = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
        return int(after_name[11]) + int(after_name[12])  # fields 14 and 15 of proc(5)
    except (OSError, ValueError, IndexError):
        return None


def others_share(before: tuple, after: tuple) -> float | None:
    """Share of all CPU time between two `snapshot()`s that went to other processes (None: unknown)."""
    if None in before or None in after:
        return None
    (total0, idle0), own0 = before
    (total1, idle1), own1 = after
    total = total1 - total0
    if total <= 0:
        return None
    others = (total - (idle1 - idle0)) - (own1 - own0)
    return min(max(others / total, 0.0), 1.0)


def snapshot() -> tuple:
    return _machine(), _own()


class OtherLoad:
    """`with OtherLoad() as load: ...` then `load.share`: the share of all CPU time other processes took
    during the block (None where the platform does not say); `load.busy`: more than BUSY_SHARE."""

    def __init__(self) -> None:
        self.share: float | None = None
        self._before: tuple = (None, None)

    def __enter__(self) -> OtherLoad:
        self._before, self._t0 = snapshot(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        # A block of a few ticks says nothing (a tiny model's measurement takes milliseconds): watch the
        # neighbours a little longer. Waiting adds none of this process's time, so it cannot look busier.
        time.sleep(max(0.0, MIN_WINDOW_S - (time.monotonic() - self._t0)))
        self.share = others_share(self._before, snapshot())

    @property
    def busy(self) -> bool:
        return self.share is not None and self.share > BUSY_SHARE


class Watch:
    """Others' load over successive windows: `busy()` says whether, since the last window ended (at least
    MIN_WINDOW_S ago: a shorter one is not judged yet, and answers False), other processes took more than
    BUSY_SHARE of all CPU time. For a long measurement that must stop as soon as the machine is not its own:
    its timings would be wrong, and its load would disturb whoever is using the machine."""

    def __init__(self) -> None:
        self._last, self._t = snapshot(), time.monotonic()

    def busy(self) -> bool:
        if time.monotonic() - self._t < MIN_WINDOW_S:
            return False
        now = snapshot()
        share = others_share(self._last, now)
        self._last, self._t = now, time.monotonic()
        return share is not None and share > BUSY_SHARE
