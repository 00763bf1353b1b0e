"""Auto k's choices round by round on bench_peers' int4 pair, and what the draft's catch-ups cost.

    python results/trust/probe-runs/trace_auto.py bench N > trace.log   # run_bench on the first N prompts
    python results/trust/probe-runs/trace_auto.py why trace.log          # one line per auto run
    python results/trust/probe-runs/trace_auto.py catch-up               # priced against timed catch-ups

`bench` runs bench_peers' own worker sequence (`specrt.bench.run_bench`: target-only, auto, k = 2, k = 4
interleaved, 2 repeats) with `CostModel.choose` hooked; `why` prints each auto run as one character per
round: `.` idle (does not pay), `p` probe, `b` behind (the catch-up would not pay back), `t` a plain step to
time it, a digit: the k chosen because it pays.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import specrt  # noqa: E402
from specrt.bench import run_bench  # noqa: E402
from specrt.engine import runner  # noqa: E402
from specrt.options import GenerationOptions  # noqa: E402
from specrt.prompts import Prompt  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402
from specrt.tuning.stepcost import DRAFT, TARGET  # noqa: E402

PROMPTS = ROOT / "results/trust/peers-s24/prompts.json"
TARGET_DIR, DRAFT_DIR = ROOT / "engines/qwen2.5-coder-1.5b-int4", ROOT / "engines/qwen2.5-coder-0.5b-int4"
NAMES = ["sort", "class", "edit", "docstring", "story", "explain", "chat-code", "chat-explain"]
LOG, PRICED = [], {}
_choose = costmodel.CostModel.choose


def traced(self, k_cap, context, alone=True, missed=0, remaining=None):
    choice = _choose(self, k_cap, context, alone, missed, remaining)
    s = self.steps
    LOG.append(
        {
            "k": choice.k,
            "why": choice.why,
            "ctx": context,
            "missed": missed,
            "a": [round(x, 2) for x in self.acceptance.rates(5)],
            "tok/s": {k: round(self.tokens_per_ms(k, context) * 1000, 1) for k in range(6)},
            "speed": round(s.speed, 3),
            **{f"t{w}": round(s.ms(TARGET, w, context), 1) for w in (1, 3, 5)},
            "d": round(s.ms(DRAFT, 1, context), 1),
        }
    )
    PRICED[missed] = round(self.catch_up_ms(missed, context), 1)
    return choice


def load(n):
    prompts = json.loads(PROMPTS.read_text())[:n]
    engine = specrt.load(TARGET_DIR, DRAFT_DIR)
    return engine, [Prompt(p["name"], p["text"], p["chat"] in (True, "True"), p["kind"]) for p in prompts]


def bench(n):
    costmodel.CostModel.choose = traced
    engine, prompts = load(n)
    marks, complete = [], engine.complete

    def marked(ids, options, **kw):
        marks.append((len(LOG), options.num_draft_tokens, options.max_new_tokens))
        return complete(ids, options, **kw)

    engine.complete = marked
    result = run_bench(engine, prompts, [None, 2, 4], 128, 2, warmup=1)
    for r in result.rows:
        print(r.prompt, r.config, round(r.tokens_per_s, 1), [round(x, 1) for x in r.runs_tokens_per_s], r.k_histogram)
    marks.append((len(LOG), "end", 0))
    for (i, k, length), (j, _, _) in zip(marks, marks[1:], strict=False):
        if k is None and length == 128:
            print(f"--- auto run, rounds {i}-{j}")
            for entry in LOG[i:j]:
                print(json.dumps(entry))


def why(path):
    symbols = {"idle": ".", "probe": "p", "behind": "b", "timing": "t", "none": "n"}
    runs, current = [], None
    for line in Path(path).read_text().splitlines():
        if line.startswith("--- auto run"):
            current = []
            runs.append(current)
        elif current is not None and line.startswith("{"):
            current.append(json.loads(line))
    for i, run in enumerate(runs):
        rounds = "".join(str(e["k"]) if e["why"] == "pays" else symbols[e["why"]] for e in run)
        print(NAMES[i // 2], f"a0={run[0]['a'][0]} d={run[0]['d']}", rounds)


def catch_up():
    costmodel.CostModel.choose = traced
    real, propose = [], runner.Runner.propose

    def timed(self, rows, *args, **kw):
        behind = [len(r.tokens) - self.draft.kv.rows[r.slot].length for r, _ in rows]
        out = propose(self, rows, *args, **kw)
        if behind and behind[0] > 2:
            real.append((behind[0] - 1, round(self.catch_up_ms, 1), len(rows[0][0].tokens)))
        return out

    runner.Runner.propose = timed
    engine, prompts = load(8)
    for p in prompts[4:6] + prompts[:1]:  # two prose prompts, then code: plain spells, then drafting
        engine.reset()
        ids = engine.encode(p.text, chat=p.chat)
        g = engine.complete(ids, GenerationOptions(max_new_tokens=128, num_draft_tokens=None, ignore_eos=True))
        print(p.name, round(g.stats.new_tokens / g.stats.total_s, 1), dict(g.stats.k_histogram))
    print("timed (tokens fed, ms, context):", real)
    print("priced (missed: ms):", {m: PRICED[m] for m in sorted(PRICED) if m in (1, 2, 4, 8, 12, 16, 24, 32, 64)})
    print("learned ratios:", engine.tuning.steps.ratios, "speed", engine.tuning.steps.speed)


if __name__ == "__main__":
    {"bench": lambda: bench(int(sys.argv[2])), "why": lambda: why(sys.argv[2]), "catch-up": catch_up}[sys.argv[1]]()
