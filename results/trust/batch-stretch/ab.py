"""In-process A/B of the batched stretch: bench_batch's prompts, warm-up and parts, with four configurations
interleaved in every part (ABBA) on one engine per concurrency: fixed k = 3 and k = 5, auto k as it is ("auto",
a row the ceiling leaves at its own k may draft past it: `BatchCost._stretched`), and auto k as before ("old":
`_stretched` patched to keep the rows' own k, so a batched row never drafts past its k).

    python results/trust/batch-stretch/ab.py fp32 2,8 0.7 4 > ab-fp32.log   # target, levels, temperatures, parts

Prints each part's tokens/s per configuration, then per level: auto / best fixed, old / best fixed, auto / old
(medians over parts of ratios within a part), and the k drafted per row-round of each auto.
"""

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

from specrt.tuning.batchcost import BatchCost  # noqa: E402

CONFIGS = {"k=3": 3, "k=5": 5, "auto": None, "old": None}
STRETCHED = BatchCost._stretched


def run(engine, c: int, name: str, temperature: float, jobs: list) -> dict:
    BatchCost._stretched = STRETCHED if name != "old" else lambda self, chosen, *rest: chosen
    try:
        return bb.run_specrt(engine, c, CONFIGS[name], temperature, jobs)
    finally:
        BatchCost._stretched = STRETCHED


def main() -> None:
    import specrt

    target, levels = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    temperatures, parts = [float(t) for t in sys.argv[3].split(",")], int(sys.argv[4])
    for c in levels:
        engine = specrt.load(bb.BUNDLES[target], bb.BUNDLES["draft"], max_batch=c)
        bb.warm_up(engine, c)
        prompts = list(enumerate(kit.mixed_prompts(parts * c)))
        for temperature in temperatures:
            speeds = {name: [] for name in CONFIGS}
            ks = {name: {} for name in ("auto", "old")}
            for part in range(parts):
                jobs = prompts[part * c : (part + 1) * c]
                for name in kit.interleave(CONFIGS, c + part):
                    engine.reset()
                    got = run(engine, c, name, temperature, jobs)
                    speeds[name].append(sum(r["tokens"] for r in got["results"]) / got["wall"])
                    for k, v in got["k_chosen"].items():
                        if name in ks and v:
                            ks[name][k] = ks[name].get(k, 0) + v
                kit.log(
                    f"{target} c={c} T={temperature} part {part + 1}: "
                    + ", ".join(f"{n} {v[-1]:.1f}" for n, v in speeds.items())
                )
            best = [max(a, b) for a, b in zip(speeds["k=3"], speeds["k=5"], strict=True)]

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


if __name__ == "__main__":
    main()
