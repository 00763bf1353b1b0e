"""A streaming generation: the reader's side of one request.

Iterating a `Generation` submits its request to the engine (once) and yields text as the scheduler commits
tokens: incremental detokenization, and stop strings (never streamed: a tail that could still grow into one
is held back until it cannot). Token ids, text, finish reason and statistics fill in as it runs. Breaking
out of the loop, `close()`, or a stop string cancels the request; the scheduler frees its slot before its
next round. No model maths here: that is the scheduler's and speculative.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..bundle.tokenizer import Tokenizer
from ..stats import Stats
from .request import END, Request


class Generation:
    """One streaming generation: iterate for text chunks; token ids, text and stats fill in as it runs.

    A generation can be iterated once. `close()` (or breaking out of a `for`) stops it early with
    finish_reason "cancelled".
    """

    def __init__(self, request: Request, tokenizer: Tokenizer, submit: Callable[[Request], None]):
        self.prompt_ids = list(request.prompt)
        self.token_ids: list[int] = []
        self.text = ""
        self._request = request
        self._tokenizer = tokenizer
        self._submit = submit
        self._started = False

    @property
    def stats(self) -> Stats:
        return self._request.stats

    @property
    def finish_reason(self) -> str | None:
        return self.stats.finish_reason

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a Generation can be iterated only once")
        self._started = True
        return self._run()  # not kept: breaking out of a for loop drops and so closes it

    def close(self) -> None:
        """Stop early (finish_reason "cancelled" unless it already finished): from any thread; a reader
        blocked on the next tokens wakes up when the scheduler retires the request, before its next round."""
        self._started = True
        self._cancel()

    def _cancel(self) -> None:
        r = self._request
        if r.stats.finish_reason is None:
            r.stats.finish_reason = "cancelled"
        r.cancel.set()

    def _run(self) -> Iterator[str]:
        r = self._request
        stops = r.options.stop
        longest = max((len(s) for s in stops), default=0)
        detok = self._tokenizer.stream_decoder(self.prompt_ids)
        emitted = 0  # characters of self.text already handed out
        self._submit(r)
        try:
            while True:
                item = r.channel.get()
                if item is END:
                    break
                if isinstance(item, BaseException):
                    raise item
                self.token_ids += item
                self.text += "".join(detok.push(t) for t in item)
                held = 0
                if stops:
                    # Search only where a stop string could newly end.
                    hits = [i for s in stops if (i := self.text.find(s, max(emitted - longest, 0))) >= 0]
                    if hits:
                        self.text = self.text[: min(hits)]
                        r.stats.finish_reason = "stop"
                        self._cancel()
                    else:
                        held = _held_back(self.text, stops)
                if len(self.text) - held > emitted:
                    yield self.text[emitted : len(self.text) - held]
                    emitted = len(self.text) - held
                if r.stats.finish_reason == "stop":
                    return
            if len(self.text) > emitted:
                yield self.text[emitted:]
        finally:
            self._cancel()  # no-op once finished; a reader that stopped early frees the slot

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
