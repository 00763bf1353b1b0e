"""Benchmark of the runtime: target-only against speculative decoding, side by side, on the same prompts.

For every prompt it runs target-only decoding (k = 0) and speculative decoding for each requested k,
`repeats` times after `warmup` short runs, interleaved (each repeat runs every configuration once, in
alternating order, so a speedup is a ratio of runs made back to back), and reports the median end-to-end
tokens/s (prefill included, caches cleared before every run), acceptance, tokens per target pass, and, for
greedy runs, whether the output equals the target-only output (with the first divergence and the target's
top-2 margin there if not).

It also measures the step costs that decide the gain: t_target(S) for S = 1 and k + 1 (the verify pass)
and t_draft(1) at the prompt's context, so each row carries the speedup that Leviathan et al.'s formula
predicts from measured quantities, E / (k c + v) with E = tokens per target pass, c = t_draft(1) / t_target(1),
v = t_target(k + 1) / t_target(1), and efficiency = achieved / predicted.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from .decoding.divergence import NEAR_TIE, divergence
from .engine.api import Engine
from .errors import OptionsError
from .options import GenerationOptions
from .prompts import Prompt
from .tuning.measure import step_times


@dataclass
class Row:
    prompt: str
    kind: str
    config: str  # "target-only", "k=N" or "auto"
    k: int | None
    tokens_per_s: float  # median over repeats, end to end
    runs_tokens_per_s: list[float]
    new_tokens: int
    acceptance_rate: float = 0.0
    tokens_per_pass: float = 1.0
    speedup: float = 1.0  # over target-only on the same prompt
    c: float | None = None  # t_draft(1) / t_target(1) (0 for n-gram rounds)
    verify_cost: float | None = None  # t_target(k+1) / t_target(1), averaged over the rounds
    predicted_speedup: float | None = None
    efficiency: float | None = None
    equal_to_target_only: bool | None = None
    divergence: dict | None = None  # {"position": i, "top2_margin": m} when greedy outputs differ
    decode_tokens_per_s: float = 0.0  # after prefill
    k_histogram: dict = field(default_factory=dict)
    rounds_by_drafter: dict = field(default_factory=dict)  # "model/4", "ngram/3", "none/0" -> rounds (last run)
    overhead_ms_per_round: float = 0.0  # wall time outside ONNX Runtime per target pass
    overhead_vs_step: float = 0.0  # ... as a fraction of one target decode step
    token_ids: list[int] = field(default_factory=list)  # the last repeat's output (greedy: all repeats')


@dataclass
class BenchResult:
    target: str
    draft: str | None
    max_new_tokens: int
    temperature: float
    repeats: int
    step_ms: dict = field(default_factory=dict)  # prompt -> {"target": {S: ms}, "draft": {1: ms}}
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def markdown(self) -> str:
        head = (
            "| prompt | config | tok/s | speedup | accept | tok/pass | c | t(k+1)/t(1) | predicted | "
            "efficiency | overhead | = target-only |"
        )
        lines = [head, "|" + "---|" * (head.count("|") - 1)]
        for r in self.rows:
            lines.append(
                f"| {r.prompt} | {r.config} | {r.tokens_per_s:.2f} | {r.speedup:.2f}x | "
                f"{_pct(r.acceptance_rate, r.k)} | {r.tokens_per_pass:.2f} | {_num(r.c)} | {_num(r.verify_cost)} | "
                f"{_num(r.predicted_speedup, 'x')} | {_num(r.efficiency)} | {100 * r.overhead_vs_step:.1f}% | "
                f"{_eq(r)} |"
            )
        return "\n".join(lines)


def _pct(x: float, k: int | None) -> str:
    return "-" if k == 0 else f"{100 * x:.0f}%"


def _num(x: float | None, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def _eq(r: Row) -> str:
    if r.equal_to_target_only is None:
        return "-"
    if r.equal_to_target_only:
        return "yes"
    d = r.divergence or {}
    return f"no (pos {d.get('position')}, margin {d.get('top2_margin', float('nan')):.3g})"


def run_bench(
    engine: Engine,
    prompts: Sequence[Prompt],
    ks: Sequence[int | None],
    max_new_tokens: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
    max_draft_tokens: int = 8,
) -> BenchResult:
    """ks: the speculative configurations to compare with target-only decoding (None: auto k)."""
    if engine.draft is None and engine.ngram is None and any(k != 0 for k in ks):
        raise OptionsError("speculative configurations need a draft (--draft DIR or --draft ngram)")
    drafts = [str(engine.draft.bundle.path)] if engine.draft else []
    result = BenchResult(
        str(engine.target.bundle.path),
        ", ".join(drafts + ["ngram"] * bool(engine.ngram)) or None,
        max_new_tokens,
        temperature,
        repeats,
    )
    configs = [0, *dict.fromkeys(k for k in ks if k != 0)]
    widest = max([max_draft_tokens if k is None else k for k in configs]) + 1
    for prompt in prompts:
        ids = engine.encode(prompt.text, chat=prompt.chat)
        steps = {"target": step_times(engine.target, ids, list(range(1, widest + 1)))}
        if engine.draft is not None:
            steps["draft"] = step_times(engine.draft, ids, [1])
        result.step_ms[prompt.name] = steps
        options = {
            k: GenerationOptions(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                num_draft_tokens=k,
                max_draft_tokens=max_draft_tokens,
                ignore_eos=True,
            )
            for k in configs
        }
        for k in configs:  # short untimed runs: page in weights, size buffers, settle threads
            for _ in range(warmup):
                engine.reset()
                engine.complete(ids, replace(options[k], max_new_tokens=min(16, max_new_tokens)))
        # Interleaved: each repeat runs every configuration once, so drift on a shared machine (a neighbour's
        # burst, the memory bandwidth it takes) hits them alike, and speedups are taken per repeat; every
        # other repeat in reverse order, so that running first or second favours no configuration.
        runs: dict[int | None, list] = {k: [] for k in configs}
        for r in range(repeats):
            for k in configs if r % 2 == 0 else configs[::-1]:
                engine.reset()
                runs[k].append(engine.complete(ids, options[k]))
        base_row, base_ids = None, None
        for k in configs:
            gens = runs[k]
            speeds = [g.stats.new_tokens / g.stats.total_s for g in gens]
            gen, s = gens[-1], gens[-1].stats
            label = "target-only" if k == 0 else "auto" if k is None else f"k={k}"
            row = Row(
                prompt.name,
                prompt.kind,
                label,
                k,
                statistics.median(speeds),
                speeds,
                s.new_tokens,
                s.acceptance_rate,
                s.tokens_per_target_pass,
                decode_tokens_per_s=statistics.median(g.stats.tokens_per_s for g in gens),
                k_histogram={str(j): n for j, n in sorted(s.k_histogram.items())},
                rounds_by_drafter=dict(sorted(s.rounds_by_drafter.items())),
                token_ids=list(gen.token_ids),
            )
            row.overhead_ms_per_round = s.overhead_ms_per_round
            row.overhead_vs_step = s.overhead_ms_per_round / steps["target"][1]
            if k == 0:
                base_row, base_ids = row, gen.token_ids
            else:
                _predict(row, s, steps, base_row)
                if temperature == 0:
                    row.equal_to_target_only = all(g.token_ids == base_ids for g in gens)
                    if not row.equal_to_target_only:
                        other = next(g.token_ids for g in gens if g.token_ids != base_ids)
                        row.divergence = divergence(engine.target, ids, base_ids, other)
            result.rows.append(row)
            log(f"{prompt.name:<22} {row.config:<12} {row.tokens_per_s:7.2f} tok/s  {row.speedup:5.2f}x")
    return result


def _predict(row: Row, stats, steps: dict, base: Row) -> None:
    """Leviathan et al.'s speedup from measured quantities, round by round: E / mean(k c + v(k+1))."""
    t = steps["target"]
    c_model = steps["draft"][1] / t[1] if "draft" in steps else 0.0
    # Paired per repeat (the runs of one repeat ran back to back), then the median.
    row.speedup = statistics.median(a / b for a, b in zip(row.runs_tokens_per_s, base.runs_tokens_per_s, strict=True))
    rounds = stats.rounds
    if not rounds:  # one new token: prefill only, nothing to predict
        return
    cost = verify = 0.0
    for key, n in stats.rounds_by_drafter.items():
        drafter, k = key.split("/")
        v = t.get(int(k) + 1, float("nan")) / t[1]
        cost += n * (int(k) * (c_model if drafter == "model" else 0.0) + v)
        verify += n * v
    row.c = c_model
    row.verify_cost = verify / rounds
    row.predicted_speedup = row.tokens_per_pass / (cost / rounds)
    # Prefill is the same in both runs; compare decode throughput with the decode-only prediction.
    row.efficiency = (row.decode_tokens_per_s / base.decode_tokens_per_s) / row.predicted_speedup


def compare_with_target_only(engine: Engine, text, options: GenerationOptions, gen, **prompt) -> str:
    """`specrt generate --compare`: time target-only decoding and the same speculative generation again, and
    say how the outputs compare (greedy: a difference is located and its target top-2 margin measured).

    Both timed runs come after `gen`: the first run of a fresh engine is slower (weights paged in, buffers
    sized; measured 0.69x for identical work, k = 0 in every round), so timing it against a warm target-only
    run would charge that to speculation. Each starts from an empty cache."""
    engine.reset()
    base = engine.complete(text, replace(options, num_draft_tokens=0), **prompt)
    engine.reset()
    again = engine.complete(text, options, **prompt)
    fast, slow = (g.stats.new_tokens / g.stats.total_s for g in (again, base))
    if gen.token_ids == base.token_ids:
        same = "identical"
    elif not options.greedy:
        same = "different (as they may be when sampling)"
    else:  # greedy: only a near-tie of the target may part them (quantized 1-token vs verify rounding)
        ids = engine.encode(text, prompt.get("chat", False), prompt.get("system"))
        d = divergence(engine.target, ids, base.token_ids, gen.token_ids)
        tie = "a near-tie" if d["top2_margin"] < NEAR_TIE else "NOT a near-tie: a bug, please report it"
        same = f"different from token {d['position']} on, where the target's top-2 logits differ by "
        same += f"{d['top2_margin']:.3f} ({tie})"
    return f"speculative {fast:.2f} tok/s vs target-only {slow:.2f} tok/s: {fast / slow:.2f}x speedup; outputs {same}"
