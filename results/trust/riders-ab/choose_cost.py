#!/usr/bin/env python
"""Milliseconds of one BatchCost.choose (the batch's per-round decision) at 2-16 rows, with riders (`room`
given) and without, on synthetic profiles and acceptance estimates of three kinds (a_1 0.6, 0.75, 0.9), rows
wanting k = 3-7.

    python results/trust/riders-ab/choose_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from specrt.tuning.acceptance import AcceptanceEstimate  # noqa: E402
from specrt.tuning.batchcost import BatchCost  # noqa: E402
from specrt.tuning.profile import BatchProfile  # noqa: E402

BATCHES, WIDTHS = [1, 2, 4, 8, 16], [1, 2, 3, 4, 5, 6, 7, 8, 9]
TARGET = BatchProfile(BATCHES, WIDTHS, [[30 + 2 * b * (w - 1) for w in WIDTHS] for b in BATCHES])
DRAFT = BatchProfile(BATCHES, WIDTHS, [[5.0 + b for _ in WIDTHS] for b in BATCHES])

for rows in (2, 4, 8, 16):
    expected = [AcceptanceEstimate(prior=0.6 + 0.15 * (r % 3)).expected_tokens for r in range(rows)]
    wanted = [3 + r % 5 for r in range(rows)]
    for ride in (True, False):
        cost, n = BatchCost(TARGET, DRAFT), 50
        room = [8] * rows if ride else None
        t0 = time.perf_counter()
        for _ in range(n):
            cost.choose(wanted, expected, [False] * rows, [True] * rows, 256, [0.0] * rows, 100, room, rows)
        print(f"{rows:2} rows, {'riders' if ride else 'no room'}: {1e3 * (time.perf_counter() - t0) / n:.2f} ms")
