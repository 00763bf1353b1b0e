"""In-process A/B of how soon a batch times a neighbouring width again (`BatchCost.stale_after`): bench_batch's
prompts, warm-up and parts; fixed k = 3 and k = 5, auto k with the shapes' ratios re-timed once stale after 32
batched rounds ("auto") and after 256 ("old", the default before), interleaved in every part (ABBA), one engine
per concurrency. The loop is results/trust/batch-stretch/ab.py's.

    python results/trust/batch-stale/ab.py fp32 2,8 0.7 4 > ab-fp32.log   # target, levels, temperatures, parts
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("batch_stretch_ab", HERE.parent / "batch-stretch" / "ab.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)  # puts scripts/ on sys.path


def stale_after(rounds: int):
    def arm(engine):
        cost = engine.scheduler.batch_cost
        before, cost.stale_after = cost.stale_after, rounds
        return lambda: setattr(cost, "stale_after", before)

    return arm


if __name__ == "__main__":
    ab.compare(sys.argv[1:], {"auto": stale_after(32), "old": stale_after(256)})
