"""In-process A/B of when a batch times a neighbouring width again: bench_batch's prompts, warm-up and parts;
plain, fixed k = 3 and k = 5, and two auto arms interleaved in every part (ABBA), one engine per concurrency.
"auto": the code as it is (a neighbour is due once untimed for the share of a round's tokens timing it would
lose / `explore_budget` rounds, at least `explore_every`; a ratio's weight fades per round). "old": the
BatchCost of 6a799b2 (one round in 16 times a neighbour untimed for 32 rounds; smoothing per timing), loaded
from git. Each auto arm keeps its own BatchCost across the parts (its own learning history, as its own server
would: the fixed configurations' rounds teach neither), sharing only the engine's set of warm shapes.

    python results/trust/batch-explore/ab.py int4 2 0.7 4 > ab-int4.log   # target, levels, temperatures, parts

The loop is results/trust/batch-stretch/ab.py's.
"""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
spec = importlib.util.spec_from_file_location("batch_stretch_ab", HERE.parent / "batch-stretch" / "ab.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)  # puts scripts/ on sys.path

OLD = "6a799b2"


def old_class():
    """BatchCost as it was at OLD, as a module of the specrt.tuning package (its relative imports resolve)."""
    text = subprocess.run(
        ["git", "show", f"{OLD}:specrt/tuning/batchcost.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "batchcost_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("specrt.tuning.batchcost_old", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module.BatchCost


def own(make):
    """An arm with its own BatchCost (made on first use from the engine's profiles), swapped in for its runs."""
    mine = {}

    def arm(engine):
        scheduler = engine.scheduler
        shared = scheduler.batch_cost
        if "cost" not in mine:
            mine["cost"] = make(shared.target, shared.draft, policy=shared.policy, warm=shared.warm)
        scheduler.batch_cost = mine["cost"]
        return lambda: setattr(scheduler, "batch_cost", shared)

    return arm


if __name__ == "__main__":
    from specrt.tuning.batchcost import BatchCost

    ab.compare(sys.argv[1:], {"auto": own(BatchCost), "old": own(old_class())})
