"""The generate loop: positions, stopping, streaming and statistics around the speculative step.

`decode` is a generator of token-id lists, one list per round, that stops on EOS, max_new_tokens or the
bundle's max_seq_len (never writing past a KV buffer). `Generation` adds text on top: incremental
detokenization and stop strings. Neither does any model maths; that is `speculative.Speculator`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from .errors import EngineBusyError, PromptError
from .options import GenerationOptions
from .speculative import Speculator
from .stats import Stats
from .tokenizer import Tokenizer


def decode(spec: Speculator, prompt_ids: list[int], eos_ids: set[int], stats: Stats) -> Iterator[list[int]]:
    options, target, draft = spec.options, spec.target, spec.draft_session
    max_len = target.max_len
    if not prompt_ids:
        raise PromptError("the prompt is empty; give at least one token of text")
    if len(prompt_ids) >= max_len:
        raise PromptError(
            f"the prompt has {len(prompt_ids)} tokens but {target.bundle.path} holds at most {max_len} "
            f"(max_seq_len), leaving no room to generate; shorten the prompt or re-export with a larger "
            "--max-seq-len"
        )
    tokens = list(prompt_ids)
    sessions = [s for s in (target, draft) if s is not None]
    # Reuse whatever each cache already holds of this prompt; at least one token must still be fed.
    for session in sessions:
        session.kv.truncate(min(session.kv.common_prefix(tokens), len(tokens) - 1))
    stats.prompt_tokens = len(tokens)
    busy_before = sum(s.busy_s for s in sessions)
    start = time.perf_counter()
    try:
        new = [spec.prefill(tokens)]
        stats.prefill_s = time.perf_counter() - start
        while True:
            new, reason = _clip(new, stats.new_tokens, options, eos_ids)
            tokens += new
            stats.new_tokens += len(new)
            if reason is None and len(tokens) >= max_len:
                reason = "length"
            yield new
            if reason is not None:
                stats.finish_reason = reason
                return
            new, drafted = spec.step(tokens, options.max_new_tokens - stats.new_tokens)
            stats.rounds += 1
            stats.drafted += drafted
            stats.accepted += len(new) - 1
            stats.k_histogram[drafted] += 1
            stats.rounds_by_drafter[f"{spec.last_drafter or 'none'}/{drafted}"] += 1
    finally:
        # A round cut short (EOS, max_new_tokens, an early close) may leave positions past the kept
        # tokens in the caches; drop them so every cache holds a prefix of `tokens`.
        target.kv.truncate(len(tokens) - 1)
        if draft is not None:
            draft.kv.truncate(len(tokens))
        stats.total_s = time.perf_counter() - start
        stats.draft_s, stats.target_s = spec.times.draft_s, spec.times.target_s
        stats.runtime_s = sum(s.busy_s for s in sessions) - busy_before


def _clip(new: list[int], done: int, options: GenerationOptions, eos_ids: set[int]) -> tuple[list[int], str | None]:
    for i, token in enumerate(new):
        if token in eos_ids and not options.ignore_eos:
            return new[: i + 1], "eos"
        if done + i + 1 >= options.max_new_tokens:
            return new[: i + 1], "max_new_tokens"
    return new, None


class Generation:
    """One streaming generation: iterate for text chunks; token ids, text and stats fill in as it runs.

    Iterating runs the models; a generation can be iterated once. `close()` (or breaking out of a `for`)
    stops it early with finish_reason "cancelled".
    """

    def __init__(
        self, spec: Speculator, tokenizer: Tokenizer, prompt_ids: list[int], turn: threading.Lock | None = None
    ):
        self.prompt_ids = list(prompt_ids)
        self.token_ids: list[int] = []
        self.text = ""
        self.stats = Stats()
        self._spec = spec
        self._tokenizer = tokenizer
        self._started = False
        self._turn = turn or threading.Lock()

    @property
    def finish_reason(self) -> str | None:
        return self.stats.finish_reason

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a Generation can be iterated only once")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[str]:
        if not self._turn.acquire(blocking=False):
            raise EngineBusyError(
                "this engine is running another generation; finish or close() it first, or load one Engine "
                "per concurrent generation"
            )
        try:
            yield from self._generate()
        finally:
            self._turn.release()

    def _generate(self) -> Iterator[str]:
        opts = self._spec.options
        detok = self._tokenizer.stream_decoder(self.prompt_ids)
        stops = opts.stop
        longest = max((len(s) for s in stops), default=0)
        emitted = 0  # characters of self.text already handed out
        rounds = decode(self._spec, self.prompt_ids, set(self._tokenizer.eos_token_ids), self.stats)
        try:
            for ids in rounds:
                self.token_ids += ids
                self.text += "".join(detok.push(t) for t in ids)
                if stops:
                    # Search only where a stop string could newly end.
                    hits = [i for s in stops if (i := self.text.find(s, max(emitted - longest, 0))) >= 0]
                    if hits:
                        self.text = self.text[: min(hits)]
                        self.stats.finish_reason = "stop"
                        rounds.close()
                    held = _held_back(self.text, stops) if not hits else 0
                else:
                    held = 0
                if len(self.text) - held > emitted:
                    yield self.text[emitted : len(self.text) - held]
                    emitted = len(self.text) - held
                if self.stats.finish_reason == "stop":
                    return
            if len(self.text) > emitted:
                yield self.text[emitted:]
        finally:
            if self.stats.finish_reason is None:
                self.stats.finish_reason = "cancelled"
            rounds.close()

    def consume(self) -> Generation:
        for _ in self:
            pass
        return self


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that could still grow into a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best
