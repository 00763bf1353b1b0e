"""Per fixed k (0-4), int4 pair, code prompts: round wall time, target pass per width and draft step mean,
against the profile (the measurement behind batch-s26-avx2's "why k = 1").

    python results/trust/widen/inloop.py 2   # repeats
"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit as kit  # noqa: E402

import specrt  # noqa: E402
from specrt.engine import runner  # noqa: E402
from specrt.options import GenerationOptions  # noqa: E402
from specrt.tuning.stepcost import DRAFT, TARGET  # noqa: E402

LOG = []
_target_pass, _propose = runner.Runner.target_pass, runner.Runner.propose


def target_pass(self, rows):
    out = _target_pass(self, rows)
    LOG.append(("t", len(rows[0][1].tokens) + 1, len(rows[0][0].tokens), out[1]))
    return out


def propose(self, rows, *args, **kw):
    out = _propose(self, rows, *args, **kw)
    LOG.extend(("d", len(p.tokens), 0, p.step_ms) for p in out.values() if p.step_ms)
    return out


def main(repeats: int) -> None:
    runner.Runner.target_pass, runner.Runner.propose = target_pass, propose
    engine = specrt.load(ROOT / "engines/qwen2.5-coder-1.5b-int4", ROOT / "engines/qwen2.5-coder-0.5b-int4")
    engine.complete(engine.encode("def f(x):"), GenerationOptions(max_new_tokens=8))
    pt, pd = engine.tuning.steps.profiles[TARGET], engine.tuning.steps.profiles[DRAFT]
    code = [t for t, _, kind in kit.mixed_prompts(12) if kind == "code"][:3]
    r = defaultdict(list)
    for rep in range(repeats):
        for text in code:
            ids = engine.encode(text)
            for k in [0, 1, 2, 3, 4] if rep % 2 == 0 else [4, 3, 2, 1, 0]:
                engine.reset()
                start = len(LOG)
                g = engine.complete(ids, GenerationOptions(max_new_tokens=128, num_draft_tokens=k, ignore_eos=True))
                r["round", k].append(1000 * g.stats.total_s / sum(1 for e in LOG[start:] if e[0] == "t"))
                r["tps", k].append(g.stats.new_tokens / g.stats.total_s)
                for kind, w, ctx, ms in LOG[start:]:
                    if kind == "t":
                        r["t", w].append(ms / pt(w, ctx))
                        r["tms", k].append(ms)
                    else:
                        r["d", k].append(ms)

    def med(key):
        return statistics.median(r[key]) if r[key] else float("nan")

    t1 = med(("tms", 0))
    print(f"plain t(1) in loop {t1:.1f} ms (profile {pt(1, 100):.1f})")
    for k in range(5):
        profiled = (k * pd(1, 100) + pt(k + 1, 100)) / pt(1, 100)
        print(
            f"k={k}: tok/s {med(('tps', k)):.1f}  round {med(('round', k)):.1f} ms = {med(('round', k)) / t1:.2f} t1"
            f" | target {med(('tms', k)):.1f} ms (live/profile {med(('t', k + 1)):.2f})"
            f" | draft step {med(('d', k)):.1f} ms | profile round {profiled:.2f} t1"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]))
