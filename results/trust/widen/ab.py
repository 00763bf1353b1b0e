"""In-process A/B, int4 pair at one stream: auto k without widening (`Policy.widen_every=None`: one verify width
and one draft step timed, as before) and with it, against fixed k = 1 and k = 3, interleaved (ABBA per prompt).

    python results/trust/widen/ab.py 2 > ab.log   # repeats; prompts: bench_batch's mixed 0-3 + bench_peers' 8

Each auto variant has its own engine (its own learned step costs); fixed k runs on the widening one.
"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit as kit  # noqa: E402

import specrt  # noqa: E402
from specrt.options import GenerationOptions  # noqa: E402


def load(widen):
    engine = specrt.load(ROOT / "engines/qwen2.5-coder-1.5b-int4", ROOT / "engines/qwen2.5-coder-0.5b-int4")
    engine.tuning.policy = dataclasses.replace(engine.tuning.policy, widen_every=widen)
    return engine


def main(repeats: int) -> None:
    engines = {"old": load(None), "new": load(32)}
    prompts = [(f"mixed{i}-{kind}", t, chat) for i, (t, chat, kind) in enumerate(kit.mixed_prompts(4))]
    peers = json.loads((ROOT / "results/trust/peers-s24/prompts.json").read_text())
    prompts += [(p["name"], p["text"], p["chat"] in (True, "True")) for p in peers]
    configs = [("old", None, "old"), ("new", None, "new"), ("k1", 1, "new"), ("k3", 3, "new")]
    for e in engines.values():
        e.complete(e.encode("def f(x):"), GenerationOptions(max_new_tokens=8))
    res = {}
    for rep in range(repeats):
        for name, text, chat in prompts:
            order = configs if rep % 2 == 0 else configs[::-1]
            for cname, k, which in order:
                engine = engines[which]
                engine.reset()
                ids = engine.encode(text, chat=chat)
                g = engine.complete(ids, GenerationOptions(max_new_tokens=128, num_draft_tokens=k, ignore_eos=True))
                res.setdefault((name, cname), []).append(g.stats.new_tokens / g.stats.total_s)
                print(rep, name, cname, round(res[(name, cname)][-1], 1), dict(g.stats.k_histogram), flush=True)
    print("prompt  old  new  k1  k3   new/old  old/best  new/best")
    ratios = []
    for name, _, _ in prompts:
        m = {c: statistics.mean(res[(name, c)]) for c, _, _ in configs}
        best = max(m["k1"], m["k3"])
        ratios.append((m["new"] / m["old"], m["old"] / best, m["new"] / best))
        print(name[:14], *(f"{m[c]:.1f}" for c, _, _ in configs), " ".join(f"{x:.3f}" for x in ratios[-1]))
    medians = [statistics.median(r) for r in zip(*ratios, strict=True)]
    print("median new/old {:.3f}  old/best {:.3f}  new/best {:.3f}".format(*medians))


if __name__ == "__main__":
    main(int(sys.argv[1]))
