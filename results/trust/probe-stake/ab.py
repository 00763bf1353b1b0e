"""In-process A/B, int4 pair at one stream, short requests one after another through one engine each (as a
server sees them): auto k with the probe's catch-up weighed against 2% of the plain time left only
(`Policy.probe_share=None`, the rule before) and also against a share of what drafting would save ("new").

    python results/trust/probe-stake/ab.py 2 64 > ab.log               # repeats, max new tokens
    python results/trust/probe-stake/ab.py 2 128 peers > ab-peers.log  # bench_peers' 8 prompts, EOS ignored

Prompts: the serve suite's 8 code prompts (results/trust/serve-code-c1/prompts.jsonl), or bench_peers' 8
(results/trust/peers-s24/prompts.json, code then prose, chat templates where marked); ABBA per prompt. Each
line: the request's tokens/s, the prior it started from (a_1) and its rounds, one character each (`.` idle,
`p` probe, `b` behind, `t` a plain step to time, `W` widen, a digit: the k chosen because it pays).
"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import specrt  # noqa: E402
from specrt.options import GenerationOptions  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402

SYMBOLS = {"idle": ".", "probe": "p", "behind": "b", "timing": "t", "none": "n", "widen": "W"}
LOG: list[tuple[str, float]] = []
_choose = costmodel.CostModel.choose


def traced(self, *args, **kw):
    choice = _choose(self, *args, **kw)
    LOG.append((str(choice.k) if choice.why == "pays" else SYMBOLS[choice.why], self.acceptance.rate(0)))
    return choice


def load(share):
    engine = specrt.load(ROOT / "engines/qwen2.5-coder-1.5b-int4", ROOT / "engines/qwen2.5-coder-0.5b-int4")
    engine.tuning.policy = dataclasses.replace(engine.tuning.policy, probe_share=share)
    return engine


def prompts_of(which: str) -> list[tuple[str, bool]]:
    if which == "peers":
        peers = json.loads((ROOT / "results/trust/peers-s24/prompts.json").read_text())
        return [(p["text"], p["chat"] in (True, "True")) for p in peers]
    lines = (ROOT / "results/trust/serve-code-c1/prompts.jsonl").open()
    return [(json.loads(line)["prompt"], False) for line in lines]


def main(repeats: int, tokens: int, which: str) -> None:
    run({"old": load(None), "new": load(costmodel.Policy().probe_share)}, repeats, tokens, which)


def run(engines: dict, repeats: int, tokens: int, which: str) -> None:
    """ABBA per prompt over two engines named "old" and "new"; a line per request, then the summary."""
    costmodel.CostModel.choose = traced
    prompts, ignore_eos = prompts_of(which), which == "peers"
    for e in engines.values():
        e.complete(e.encode("def f(x):"), GenerationOptions(max_new_tokens=8))
    speeds = {name: [] for name in engines}
    drafted = dict.fromkeys(engines, 0)
    for rep in range(repeats):
        for i, (text, chat) in enumerate(prompts):
            order = list(engines) if (rep * len(prompts) + i) % 2 == 0 else list(engines)[::-1]
            for name in order:
                engine, start = engines[name], len(LOG)
                options = GenerationOptions(max_new_tokens=tokens, ignore_eos=ignore_eos)
                g = engine.complete(engine.encode(text, chat=chat), options)
                speed = g.stats.new_tokens / g.stats.total_s
                speeds[name].append(speed)
                drafted[name] += g.stats.drafted > 0
                rounds = LOG[start:]
                line = "".join(c for c, _ in rounds)
                print(f"{rep} {i} {name} {speed:5.1f} a1={rounds[0][1]:.2f} {line}", flush=True)
    old, new = speeds["old"], speeds["new"]
    ratios = [n / o for n, o in zip(new, old, strict=True)]
    print(
        f"requests that drafted: old {drafted['old']} of {len(old)}, new {drafted['new']} of {len(new)}; mean "
        f"tok/s old {statistics.mean(old):.2f} new {statistics.mean(new):.2f}; new / old per request: "
        f"median {statistics.median(ratios):.3f}, mean {statistics.mean(ratios):.3f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "code")
