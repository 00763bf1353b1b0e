"""One request's state in the engine: its tokens, options, randomness, slot, cost model and statistics, and
the channel its Generation reads from.

A request knows nothing about the other rows of the batch or about graphs. The scheduler moves it through
waiting -> prefilling -> running -> finished and hands it new tokens; `commit` applies the stopping rules
(EOS, max_new_tokens, the bundle's max_seq_len) and streams what survives to the reader.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

import numpy as np

from ..options import GenerationOptions
from ..stats import Stats
from ..tuning.costmodel import RequestCosts

END = object()  # the last item on a request's channel
_ids = itertools.count()


class Request:
    def __init__(self, prompt: list[int], options: GenerationOptions, eos_ids: set[int], max_len: int):
        self.id = next(_ids)
        self.prompt = list(prompt)
        self.options = options
        self.eos_ids = eos_ids
        self.max_len = max_len  # of the target's KV slot: prompt + output
        self.tokens = list(prompt)  # prompt + committed output
        self.rng = np.random.default_rng(options.seed)  # the request's own randomness, never shared
        self.state = "waiting"
        self.slot: int | None = None
        self.drafters: list = []  # NgramDrafter / "model": what may draft for this request
        self.costs: RequestCosts | None = None  # its cost models, when k is auto
        self.stats = Stats(prompt_tokens=len(prompt))
        self.channel: queue.SimpleQueue = queue.SimpleQueue()  # lists of ids, then END or an exception
        self.cancel = threading.Event()
        self.submitted = time.perf_counter()
        self.started: float | None = None  # first prefill chunk
        # Output tokens decoded in rounds the row ran alone before its draft was first fed: part of drafting's
        # entry fee, like the prompt (scheduler.py: `_missed`).
        self.entry_output = 0

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def remaining(self) -> int:
        """Tokens this request may still produce: max_new_tokens and the slot's room both bound it."""
        return max(0, min(self.options.max_new_tokens - self.generated, self.max_len - len(self.tokens)))

    def commit(self, new: list[int]) -> bool:
        """Append a round's tokens, cut at EOS or max_new_tokens; stream them. True when the request is done."""
        reason = None
        for i, token in enumerate(new):
            if token in self.eos_ids and not self.options.ignore_eos:
                new, reason = new[: i + 1], "eos"
                break
            if self.generated + i + 1 >= self.options.max_new_tokens:
                new, reason = new[: i + 1], "max_new_tokens"
                break
        self.tokens += new
        self.stats.new_tokens += len(new)
        if reason is None and len(self.tokens) >= self.max_len:
            reason = "length"
        self.channel.put(new)
        if reason is not None:
            self.finish(reason)
        return reason is not None

    def finish(self, reason: str) -> None:
        if self.state == "finished":
            return
        self.state = "finished"
        if self.stats.finish_reason is None:  # the reader may have set it first (a stop string, a close)
            self.stats.finish_reason = reason
        self.stats.total_s = time.perf_counter() - (self.started or self.submitted)
        self.channel.put(END)

    def fail(self, error: BaseException) -> None:
        """An error while running this request: its reader raises it; the engine goes on."""
        if self.state == "finished":
            return
        self.state = "finished"
        self.stats.finish_reason = "error"
        self.channel.put(error)
