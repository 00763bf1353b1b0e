"""The ratios of a bench_peers run: auto / best fixed k per prompt (each specrt target), specrt int4 auto / the
fastest peer configuration per prompt (where peers ran), and every configuration's median tok/s.

    python results/trust/peers-s24/ratios.py results/trust/peers-s24/results.json
"""

import json
import statistics
import sys
from pathlib import Path


def main(path: str) -> None:
    data = json.loads(Path(path).read_text())
    by: dict[tuple[str, str], dict[str, float]] = {}
    for block in data["results"]:
        for row in block.get("rows", []):
            by.setdefault((block["config"], row["config"]), {})[row["prompt"]] = row["tokens_per_s"]
    prompts = list(next(iter(by.values())))
    for target in ("specrt-int4", "specrt-native"):
        if (target, "auto") not in by:
            continue
        auto = by[target, "auto"]
        fixed = [v for (c, k), v in by.items() if c == target and k.startswith("k=")]
        ratios = [auto[p] / max(f[p] for f in fixed) for p in prompts]
        cells = " ".join(f"{p} {x:.3f}" for p, x in zip(prompts, ratios, strict=True))
        print(f"{target} auto / best fixed: {cells} | >= 0.95: {sum(x >= 0.95 for x in ratios)} of {len(ratios)}")
    peers = {k: v for k, v in by.items() if not k[0].startswith("specrt")}
    if peers and ("specrt-int4", "auto") in by:
        auto, line = by["specrt-int4", "auto"], []
        for p in prompts:
            best = max(peers, key=lambda k, p=p: peers[k][p])
            line.append(f"{p} {auto[p] / peers[best][p]:.2f} ({best[0]} {best[1]} {peers[best][p]:.1f})")
        print("int4 auto / fastest peer:", "; ".join(line))
    print("medians:", {f"{a} {b}": round(statistics.median(v.values()), 2) for (a, b), v in by.items()})


if __name__ == "__main__":
    main(sys.argv[1])
