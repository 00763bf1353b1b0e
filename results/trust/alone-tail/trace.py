#!/usr/bin/env python
"""Why auto k's row makes fewer tokens a round than fixed k = 5 once it runs alone after its batch (a greedy
prose row after a code row finished: 2.1 tokens a round against 2.7, results/trust/batch-bookkeeping).

    python results/trust/alone-tail/trace.py fp32 2 4 0 [config ...]

(target, concurrency, parts, temperature; configurations: auto and k=5 unless named.) Runs bench_batch's parts
(same prompts, same warm-up, configurations interleaved in one engine) and logs every row of every target pass:
the round's row count, the k it was given, the draft steps' and the target pass's milliseconds, its drafts'
confidences, how many were accepted, and for auto rows
the cost model's state (the choice, the per-position acceptance estimate, the calibrated rate of each
confidence) and where the early stop ended the draft. Greedy output does not depend on the configuration, so
afterwards the draft reads each finished sequence once, teacher-forced: at every output position its greedy
token and that token's probability. A greedy draft chain from position p proposes exactly those tokens while
they agree with the output, so `run[p]` (the agreeing tokens from p on) is what any k would have had accepted
from p: a counterfactual for each round auto ran, and the true acceptance of each confidence bucket, against
the calibration the early stop used. Prints the split alone / batched per configuration, the early stops
alone with what going on would have gained, and the calibration table against the truth (greedy only: sampled
output differs between configurations), and per configuration the milliseconds of a round's draft steps per
drafted token and of its target pass per width; writes <target>-c<c>[-t<T>].json beside this file.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

from specrt.engine import runner  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402
from specrt.tuning.costmodel import MODEL  # noqa: E402
from specrt.tuning.stepcost import TARGET  # noqa: E402


def install(log: list[dict], requests: dict) -> None:
    """Wrap the runner's propose (each row's k) and target pass (drafts, confidences, accepted) and the cost
    model's choose (the choice, kept on the model) and keep_drafting (the early stop)."""
    propose, target_pass = runner.Runner.propose, runner.Runner.target_pass
    choose, keep = costmodel.CostModel.choose, costmodel.CostModel.keep_drafting
    given: dict[int, int] = {}
    timed = {"propose_ms": 0.0, "catch_up_ms": 0.0}

    def traced_propose(self, rows, more, early=lambda r: True, rides=lambda r: False):
        given.clear()
        given.update({r.id: k for r, k in rows})
        t0 = time.perf_counter()
        out = propose(self, rows, more, early, rides)
        timed["propose_ms"], timed["catch_up_ms"] = 1000 * (time.perf_counter() - t0), self.catch_up_ms
        return out

    def traced_choose(self, k_cap, context, alone=True, missed=0, remaining=None):
        choice = choose(self, k_cap, context, alone, missed, remaining)
        self.traced_choice = choice
        self.traced_stop = None
        return choice

    def traced_keep(self, confidences, k, context):
        going = keep(self, confidences, k, context)
        if not going and len(confidences) < k:
            self.traced_stop = (len(confidences), k)
        return going

    def traced_target_pass(self, rows):
        decided, ms = target_pass(self, rows)
        for (r, p), (accepted, _) in zip(rows, decided, strict=True):
            requests[r.id] = r
            entry = {
                "req": r.id,
                "pos": len(r.tokens),  # the sequence index of the round's first draft
                "rows": len(rows),
                "k": given.get(r.id, 0),
                "drafted": len(p.tokens),
                "lookup": p.lookup,
                "conf": [round(float(c), 4) for c in p.confidences],
                "accepted": accepted,
                "ms": round(ms, 2),
                "draft_ms": round(timed["propose_ms"] - timed["catch_up_ms"], 2) if p.tokens else 0.0,
            }
            cost = r.costs.get(MODEL) if r.costs else None
            if cost is not None and getattr(cost, "traced_choice", None) is not None:
                choice = cost.traced_choice
                entry |= {
                    "choice": [choice.k, choice.why, choice.stretch],
                    "rates": [round(a, 3) for a in cost.acceptance.rates(8)],
                    "calibrated": [round(cost.calibration.rate(c), 3) for c in p.confidences],
                    "stop": cost.traced_stop,
                }
                cost.traced_choice = None
            log.append(entry)
        timed["propose_ms"] = timed["catch_up_ms"] = 0.0
        return decided, ms

    runner.Runner.propose, runner.Runner.target_pass = traced_propose, traced_target_pass
    costmodel.CostModel.choose, costmodel.CostModel.keep_drafting = traced_choose, traced_keep


def teacher_forced(engine, sequence: list[int], start: int) -> tuple[np.ndarray, np.ndarray]:
    """The draft's greedy token and its probability at every position from `start` on, given the sequence
    before it (one forward over the whole sequence in slot 0)."""
    draft = engine.scheduler.runner.draft
    draft.kv.rows[0].reset()
    logits = np.asarray(draft.run([0], [sequence[:-1]], [len(sequence) - start])[0], dtype=np.float64)
    draft.kv.rows[0].reset()
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    picks = probs.argmax(axis=1)
    return picks, probs[np.arange(len(picks)), picks]


def cost_split(log: list[dict], configs: list[str]) -> list[str]:
    """Per configuration, its rows' rounds alone and batched: tokens and drafts a round; alone, also the draft
    steps' milliseconds per drafted token, the target pass's per width, and tokens/s over the two."""
    lines = []
    for name in configs:
        for alone in (True, False):
            es = [e for e in log if e["config"] == name and (e["rows"] == 1) is alone]
            if not es:
                continue
            n, made, drafted = len(es), sum(e["accepted"] + 1 for e in es), sum(e["drafted"] for e in es)
            line = f"{name} {'alone' if alone else 'batched'}: {n} row-rounds, {made / n:.2f} tokens a round, "
            line += f"{drafted / n:.2f} drafted"
            if alone:
                draft_ms, target_ms = sum(e["draft_ms"] for e in es), sum(e["ms"] for e in es)
                line += f", draft {draft_ms / max(drafted, 1):.1f} ms per drafted token, "
                line += f"{1000 * made / (draft_ms + target_ms):.2f} tok/s over draft + target time"
                widths: dict[int, list[float]] = defaultdict(list)
                for e in es:
                    widths[e["drafted"] + 1].append(e["ms"])
                line += "\n  target pass ms by width (rounds): " + ", ".join(
                    f"{w}: {statistics.median(v):.0f} ({len(v)})" for w, v in sorted(widths.items())
                )
            lines.append(line)
    return lines


def greedy_analysis(engine, log: list[dict], requests: dict, runs: list[dict], configs: list[str]):
    """The teacher-forced counterfactual and calibration check (greedy runs only); returns lines and `forced`."""
    # Greedy output is the same under every configuration (checked), so each prompt's sequence is read once.
    forced: dict[int, dict] = {}  # request id -> {"start", "run"}
    by_prompt: dict[int, list[int]] = {}
    for run in runs:
        for i, out in run["outputs"].items():
            if by_prompt.setdefault(i, out) != out:
                print(f"prompt {i}: output differs between configurations (greedy should not)")
    calibration_truth: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    cal = engine.tuning.calibration
    for rid, r in requests.items():
        start = len(r.prompt)
        picks, conf = teacher_forced(engine, r.tokens, start)
        seq = np.asarray(r.tokens[start:])
        match = picks == seq
        run = np.zeros(len(match) + 1, dtype=int)  # run[i]: agreeing tokens from output index i on
        for i in range(len(match) - 1, -1, -1):
            run[i] = run[i + 1] + 1 if match[i] else 0
        forced[rid] = {"start": start, "run": run.tolist(), "conf": conf.tolist()}
        for m, q in zip(match, conf, strict=True):
            b = cal._bucket(float(q))
            calibration_truth[b][0] += int(m)
            calibration_truth[b][1] += 1

    def counterfactual(e: dict, k: int) -> int:
        f = forced[e["req"]]
        return min(f["run"][e["pos"] - f["start"]], k)

    lines = []
    for name in configs:
        for alone in (True, False):
            es = [e for e in log if e["config"] == name and (e["rows"] == 1) is alone]
            if es:
                k5 = sum(counterfactual(e, 5) + 1 for e in es)
                lines.append(
                    f"{name} {'alone' if alone else 'batched'}: k = 5 from the same positions {k5 / len(es):.2f}"
                )
    auto_alone = [e for e in log if e["config"] == "auto" and e["rows"] == 1 and "choice" in e]
    stops = [e for e in auto_alone if e.get("stop")]
    lines.append(f"auto alone: {len(auto_alone)} rounds, {len(stops)} ended by the early stop")
    outcomes: dict[str, list] = defaultdict(list)
    for e in stops:
        j, ceiling = e["stop"]
        more = counterfactual(e, ceiling) - e["accepted"]  # tokens the draft's ceiling would have added
        outcomes["all accepted" if e["accepted"] == j else "rejected"].append(more)
    for what, more in outcomes.items():
        lines.append(
            f"  stops whose drafts were {what}: {len(more)}, going on to the ceiling would have added "
            f"{sum(more)} tokens ({sum(1 for m in more if m)} of them some)"
        )
    ks: dict[str, int] = defaultdict(int)
    for e in auto_alone:
        ks[f"{e['choice'][0]}+{e['choice'][2]} {e['choice'][1]}"] += 1
    lines.append(f"auto alone's choices (k+stretch why): {dict(sorted(ks.items()))}")
    if auto_alone:
        mean_rates = np.mean([e["rates"] for e in auto_alone], axis=0)
        lines.append(f"auto alone's acceptance estimate a_1..a_8 (mean): {np.round(mean_rates, 3).tolist()}")
        # The truth at the same positions: P(draft i accepted | drafts before it accepted), from run[].
        truth = []
        for i in range(8):
            tested = [e for e in auto_alone if counterfactual(e, 8) >= i]
            truth.append(sum(1 for e in tested if counterfactual(e, 8) > i) / max(1, len(tested)))
        lines.append(f"  the truth at auto alone's positions: {np.round(truth, 3).tolist()}")
    lines.append("calibration (bucket from: the table at the end / the truth over every output token, n):")
    for b, (hits, n) in sorted(calibration_truth.items()):
        lines.append(f"  {cal.edges[b]:.2f}: {cal.rate(cal.edges[b]):.3f} / {hits / n:.3f} ({n})")
    return lines, forced


def main() -> int:
    target, c, parts, temperature = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    configs = sys.argv[5:] or ["auto", "k=5"]
    import specrt

    log: list[dict] = []
    requests: dict = {}
    install(log, requests)
    engine = specrt.load(bb.BUNDLES[target], bb.BUNDLES["draft"], max_batch=c)
    bb.warm_up(engine, c)
    prompts = list(enumerate(kit.mixed_prompts(parts * c)))
    log.clear()
    requests.clear()
    runs = []
    for part in range(parts):
        jobs = prompts[part * c : (part + 1) * c]
        for name in kit.interleave(configs, part):
            engine.reset()
            start = len(log)
            outputs: dict = {}
            got = bb.run_specrt(engine, c, bb.CONFIGS[name], temperature, jobs, outputs)
            runs.append({"part": part + 1, "config": name, "outputs": outputs})
            for e in log[start:]:
                e["config"], e["part"] = name, part + 1
            tokens = sum(r["tokens"] for r in got["results"])
            print(f"part {part + 1} {name}: {tokens / got['wall']:.1f} tok/s", flush=True)

    lines = cost_split(log, configs)
    forced: dict = {}
    if temperature == 0:  # sampled output differs between configurations: no counterfactual
        more, forced = greedy_analysis(engine, log, requests, runs, configs)
        lines += more
    steps = engine.tuning.steps
    if steps is not None:
        ctx = 256
        lines.append(
            "step costs at 256 tokens (ms): target "
            + ", ".join(f"t({w}) {steps.ms(TARGET, w, ctx):.1f}" for w in (1, 2, 4, 6, 8))
            + f"; draft step {steps.draft_round_ms(1, ctx):.1f}"
        )
    print("\n".join(lines))
    out = Path(__file__).with_name(f"{target}-c{c}{f'-t{temperature:g}' if temperature else ''}.json")
    out.write_text(json.dumps({"log": log, "forced": forced, "summary": lines}) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
