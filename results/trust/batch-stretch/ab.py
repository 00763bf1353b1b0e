"""In-process A/B of the batched stretch: bench_batch's prompts, warm-up and parts, with five configurations
interleaved in every part (ABBA) on one engine per concurrency: plain, fixed k = 3 and k = 5, auto k as it is ("auto",
a row the ceiling leaves at its own k may draft past it: `BatchCost._stretched`), and auto k as before ("old":
`_stretched` patched to keep the rows' own k, so a batched row never drafts past its k). Runs on the commit that
had the stretch (6adffe4; reverted after this A/B):

    git checkout 6adffe4 && python results/trust/batch-stretch/ab.py fp32 2,8 0.7 4 > ab-fp32.log

Arguments: target, levels, temperatures, parts. Prints each part's tokens/s per configuration, then per level:
auto / best fixed, old / best fixed, auto / old (medians over parts of ratios within a part), and the k drafted
per row-round of each auto. `compare` is the loop, shared with other batch A/Bs (results/trust/batch-stale).
"""

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

FIXED = {"plain": 0, "k=3": 3, "k=5": 5}  # plain joined after the fp32 runs (their "best fixed": k = 3, k = 5)
Arm = Callable[[object], Callable[[], None]]  # sets an auto arm up on the engine; returns its undo


def compare(argv: list[str], arms: dict[str, Arm]) -> None:
    """Two auto arms ("auto": the code as it is, "old") and the fixed k, interleaved per part."""
    import specrt

    target, levels = argv[0], [int(c) for c in argv[1].split(",")]
    temperatures, parts = [float(t) for t in argv[2].split(",")], int(argv[3])
    configs = [*FIXED, *arms]
    for c in levels:
        engine = specrt.load(bb.BUNDLES[target], bb.BUNDLES["draft"], max_batch=c)
        bb.warm_up(engine, c)
        prompts = list(enumerate(kit.mixed_prompts(parts * c)))
        for temperature in temperatures:
            speeds: dict[str, list[float]] = {name: [] for name in configs}
            ks: dict[str, dict[int, int]] = {name: {} for name in arms}
            for part in range(parts):
                jobs = prompts[part * c : (part + 1) * c]
                for name in kit.interleave(configs, c + part):
                    engine.reset()
                    undo = arms[name](engine) if name in arms else (lambda: None)
                    try:
                        got = bb.run_specrt(engine, c, FIXED.get(name), temperature, jobs)
                    finally:
                        undo()
                    speeds[name].append(sum(r["tokens"] for r in got["results"]) / got["wall"])
                    for k, v in got["k_chosen"].items():
                        if name in ks and v:
                            ks[name][k] = ks[name].get(k, 0) + v
                line = ", ".join(f"{n} {v[-1]:.1f}" for n, v in speeds.items())
                kit.log(f"{target} c={c} T={temperature} part {part + 1}: {line}")
            best = [max(fixed) for fixed in zip(*(speeds[name] for name in FIXED), strict=True)]

            def median(xs, ys):
                return statistics.median(x / y for x, y in zip(xs, ys, strict=True))

            auto, old = speeds["auto"], speeds["old"]
            kit.log(
                f"{target} c={c} T={temperature}: auto / best fixed {median(auto, best):.3f}, "
                f"old / best fixed {median(old, best):.3f}, auto / old {median(auto, old):.3f}"
            )
            for name, hist in ks.items():
                kit.log(f"  {name} k drafted per row-round: {dict(sorted(hist.items()))}")
        del engine


def unstretched(engine) -> Callable[[], None]:
    from specrt.tuning.batchcost import BatchCost

    stretched = BatchCost._stretched
    BatchCost._stretched = lambda self, chosen, *rest: chosen
    return lambda: setattr(BatchCost, "_stretched", stretched)


if __name__ == "__main__":
    compare(sys.argv[1:], {"auto": lambda engine: lambda: None, "old": unstretched})
