#!/usr/bin/env python
"""From trace.py's log: auto's rounds alone, replayed at the same positions under other rules (greedy: a k
accepts min(run, k) there), priced with the target pass times the trace measured per width (medians over both
configurations' rounds alone) and the draft step the engine learned (22.3 ms: trace.py's last line).

    python results/trust/alone-tail/counterfactual.py fp32-c2.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

DRAFT_MS = 22.3

d = json.loads((Path(__file__).parent / (sys.argv[1] if len(sys.argv) > 1 else "fp32-c2.json")).read_text())
log, forced = d["log"], d["forced"]
widths = defaultdict(list)
for e in log:
    if e["rows"] == 1:
        widths[e["drafted"] + 1].append(e["ms"])
target = {w: statistics.median(v) for w, v in widths.items()}


def run(e: dict) -> int:
    f = forced[str(e["req"])]
    return f["run"][e["pos"] - f["start"]]


def price(drafted: int) -> float:
    return DRAFT_MS * drafted + target.get(drafted + 1, target[max(target)])


rounds = [e for e in log if e["config"] == "auto" and e["rows"] == 1 and e.get("choice") and e["drafted"]]
rules = {
    "auto as it ran": lambda e: (e["accepted"], e["drafted"]),
    "auto's ceiling, no early stop": lambda e: (min(run(e), e["k"]), e["k"]),
    "auto's k, no stretch, no early stop": lambda e: (min(run(e), e["choice"][0]), e["choice"][0]),
    **{f"fixed k = {k}": (lambda e, k=k: (min(run(e), k), k)) for k in (2, 3, 4, 5, 6, 7)},
    "oracle (drafts exactly what is accepted, + 1)": lambda e: (run(e), run(e) + 1),
}
print(
    f"{len(rounds)} drafting rounds of auto alone; target pass ms per width: "
    + ", ".join(f"{w}: {ms:.0f}" for w, ms in sorted(target.items()))
)
base = None
for name, rule in rules.items():
    tokens = ms = 0.0
    for e in rounds:
        accepted, drafted = rule(e)
        tokens += min(accepted, drafted) + 1
        ms += price(drafted)
    rate = 1000 * tokens / ms
    base = base or rate
    print(
        f"{name:46} {tokens / len(rounds):.2f} tokens a round, {ms / len(rounds):.0f} ms, "
        f"{rate:.2f} tok/s ({rate / base:.3f})"
    )
