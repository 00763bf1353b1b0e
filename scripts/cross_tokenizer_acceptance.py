#!/usr/bin/env python
"""How well would a draft of ANOTHER tokenizer draft for a target? A measurement, before building it.

A draft that speaks another tokenizer can only propose text: each round it continues the decoded context with
k of its own tokens, the target re-tokenizes context + proposed text and checks the tokens past its context
in one pass, keeping the longest prefix equal to its own greedy picks (so greedy output stays exactly the
target's: lossless by construction, whatever the proposal). This script replays that rule exactly, offline:
it first decodes each prompt with the target alone (its greedy tokens are what any verification would
accept), then walks the rounds, asking the draft for k tokens of text from the decoded context each round
and counting how many target tokens that text would have had accepted. The same walk with a draft of the
target's own tokenizer (token ids proposed directly) is the baseline.

    python scripts/cross_tokenizer_acceptance.py \\
        --target engines/qwen2.5-coder-1.5b-int4 \\
        --text-draft /tmp/smollm2-draft --token-draft engines/qwen2.5-coder-0.5b-int4 --k 3 --new-tokens 64

(the SmolLM2 draft bundle: `specrt export --model models/smollm2-135m-instruct.gguf --role draft --out DIR`).
Counts only, no timings: what a round would accept, not what it would cost.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Walk:
    rounds: int = 0
    proposed: int = 0  # target tokens the proposals came to
    accepted: int = 0  # of them, accepted (equal to the target's greedy tokens)
    broken: int = 0  # rounds whose re-tokenized context no longer starts with the target's own ids

    def add(self, other: Walk) -> None:
        self.rounds += other.rounds
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.broken += other.broken

    def row(self) -> dict:
        return {
            "rounds": self.rounds,
            "tokens_per_round": round((self.accepted + self.rounds) / max(self.rounds, 1), 3),
            "acceptance": round(self.accepted / max(self.proposed, 1), 3),
            "boundary_breaks": self.broken,
        }


class Drafter:
    """Greedy k-token continuations from one bundle, its slot-0 KV reused across rounds (rolled back to the
    longest prefix it still shares with the new context)."""

    def __init__(self, path: Path):
        import specrt
        from specrt.runtime.session import ModelSession

        bundle = specrt.open_bundle(path)
        self.session, self.tokenizer = ModelSession(bundle), bundle.load_tokenizer()

    def continue_ids(self, context: list[int], k: int) -> list[int]:
        row = self.session.kv.rows[0]
        held = row.ids
        same = 0
        while same < min(len(held), len(context) - 1) and held[same] == context[same]:
            same += 1
        row.rollback(len(held) - same)
        logits = self.session.forward(context[same:], keep=1)
        out = []
        for _ in range(k):
            out.append(int(np.argmax(logits[-1])))
            if len(out) < k:
                logits = self.session.forward(out[-1:], keep=1)
        return out


def target_greedy(engine, prompt_ids: list[int], n: int) -> list[int]:
    from specrt import GenerationOptions

    return engine.complete(prompt_ids, GenerationOptions(max_new_tokens=n, ignore_eos=True)).token_ids


def walk(prompt: list[int], truth: list[int], propose) -> Walk:
    """Rounds over the target's greedy output `truth`: each round `propose(context_ids)` gives target ids; the
    accepted prefix plus the target's own next token are taken."""
    w, done = Walk(), 0
    while done < len(truth):
        proposal, broke = propose(prompt + truth[:done])
        w.rounds += 1
        w.broken += broke
        proposal = proposal[: len(truth) - done - 1]  # the last token is always the target's own
        n = 0
        while n < len(proposal) and proposal[n] == truth[done + n]:
            n += 1
        w.proposed += len(proposal)
        w.accepted += n
        done += n + 1
    return w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--text-draft", type=Path, required=True, help="a draft bundle of another tokenizer")
    parser.add_argument("--token-draft", type=Path, help="a draft bundle of the target's tokenizer (baseline)")
    parser.add_argument("--k", type=int, default=3, help="draft tokens per round (the draft's own tokens)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    args = parser.parse_args()

    import specrt
    from specrt.prompts import DEFAULT_PROMPTS

    target_tok = specrt.open_bundle(args.target).load_tokenizer()
    engine = specrt.load(args.target)
    text_draft = Drafter(args.text_draft)
    token_draft = Drafter(args.token_draft) if args.token_draft else None

    def by_text(context: list[int]) -> tuple[list[int], bool]:
        text = target_tok.decode(context, skip_special_tokens=False)
        draft_ids = text_draft.tokenizer.encode(text)
        piece = text_draft.tokenizer.decode(text_draft.continue_ids(draft_ids, args.k))
        again = target_tok.encode(text + piece, add_special_tokens=False)
        if again[: len(context)] == context:
            return again[len(context) :], False
        # The proposal merged into the context's last token(s): from the first id that differs, its tokens
        # cannot extend the target's own sequence; what follows the context is proposed on its own.
        return target_tok.encode(piece, add_special_tokens=False), True

    def by_ids(context: list[int]) -> tuple[list[int], bool]:
        return token_draft.continue_ids(context, args.k), False

    table = []
    totals = {"text": Walk(), "ids": Walk()}
    for p in DEFAULT_PROMPTS:
        prompt = target_tok.encode_chat(p.text) if p.chat else target_tok.encode(p.text)
        truth = target_greedy(engine, prompt, args.new_tokens)
        row = {"prompt": p.name, "kind": p.kind}
        for name, propose in (("text", by_text), ("ids", by_ids if token_draft else None)):
            if propose is None:
                continue
            w = walk(prompt, truth, propose)
            row[name] = w.row()
            totals[name].add(w)
        table.append(row)
        print(json.dumps(row), flush=True)
    summary = {name: w.row() for name, w in totals.items() if w.rounds}
    print("all prompts:", json.dumps(summary))
    if args.out:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": table, "all": summary}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
