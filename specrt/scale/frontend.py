"""The front end: `specrt serve`'s starlette app (the same protocol, errors, streaming and metrics code) over
engines that run in other replicas.

`RemoteEngine` is the engine interface the app uses (`generate`, `encode_messages`, `max_batch`, `stats`,
`cancel_all`): prompts are checked and tokenized here, against the target bundle's tokenizer and manifest,
with the engine's own one-line errors (specrt/engine/prompting.py), then sent as token ids through a Ray Serve
handle to an engine replica (the router picks which; specrt/scale/router.py). `RemoteGeneration` is what the
app iterates: the replica's streamed pieces, with token ids, finish reason and statistics as the replica
reports them. The app reads it on its event loop (`async for`: a handle's response is awaited there, with no
worker thread per piece as a local Generation needs). A replica that dies mid-stream surfaces as an exception
from the iteration, which the app already turns into a clean error (an error event in a stream, a 500
otherwise).

Counters at this front end (`stats`) are what it saw: requests in flight through it, and the finished ones'
tokens and speculation; the engines' own counters are each replica's (specrt/scale/replica.py).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence

from ..bundle.loading import open_bundle
from ..engine.prompting import Prompts
from ..options import GenerationOptions
from ..serve.server import ServeConfig, create_app
from .replica import Job

SUMMED = {"target_passes": "rounds", "drafted": "draft_tokens", "accepted": "accepted_tokens"}
SUMMED |= {"prompt_tokens": "prompt_tokens", "cached_tokens": "cached_prompt_tokens", "new_tokens": "generated_tokens"}


class RemoteStats:
    """A finished remote generation's statistics (the replica's Stats.to_dict(), with its replica id)."""

    def __init__(self, values: dict | None = None):
        self.values = values or {}

    def to_dict(self) -> dict:
        return dict(self.values)


class RemoteGeneration:
    def __init__(self, engine: RemoteEngine, ids: list[int], options: GenerationOptions):
        self.engine, self.prompt_ids, self.options = engine, ids, options
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stats = RemoteStats()
        self._response = None
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[str]:
        """The replica's stream, read on the app's event loop (no worker thread per piece, as a local
        Generation needs): ("piece", text, ids) messages, then ("end", finish reason, stats)."""
        if self._response is not None or self._closed:
            raise RuntimeError("a RemoteGeneration can be iterated only once")
        self._response = self.engine.handle.generate.remote(Job(self.prompt_ids, self.options))
        with self.engine.flying(self):
            async for kind, *rest in self._response:
                if kind == "piece":
                    text, ids = rest
                    self.token_ids += ids
                    self.text += text
                    self.engine.progress += 1
                    if text:
                        yield text
                else:
                    self.finish_reason, values = rest
                    self.stats = RemoteStats(values)
                    self.engine.finished(values)

    def close(self) -> None:
        """Cancel the call (the replica closes its generation, freeing the slot); a no-op once finished."""
        self._closed = True
        if self.finish_reason is None:
            self.finish_reason = "cancelled"
            if self._response is not None:
                self._response.cancel()


class RemoteEngine:
    def __init__(self, handle, prompts: Prompts, max_batch: int):
        self.handle = handle.options(stream=True)
        self.prompts, self.max_batch = prompts, max_batch
        self.progress = 0  # pieces received: /health's sign of life
        self._sums: Counter = Counter()
        self._k: Counter = Counter()
        self._open: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()

    def encode_messages(self, messages: Sequence[dict]) -> list[int]:
        return self.prompts.encode_messages(messages)

    def generate(self, prompt: str | Sequence[int], options: GenerationOptions | None = None) -> RemoteGeneration:
        return RemoteGeneration(self, self.prompts.ids(prompt), options or GenerationOptions())

    @contextlib.contextmanager
    def flying(self, gen: RemoteGeneration) -> Iterator[None]:
        """While a generation streams: counted as running, and cancel_all reaches it."""
        with self._lock:
            self._open.add(gen)
        try:
            yield
        finally:
            with self._lock:
                self._open.discard(gen)

    def finished(self, values: dict) -> None:
        with self._lock:
            for key, name in SUMMED.items():
                self._sums[name] += values.get(key, 0)
            for k, n in values.get("k_histogram", {}).items():
                self._k[int(k)] += n
            self._sums["requests"] += 1

    @property
    def stats(self) -> dict:
        with self._lock:
            sums, ks, running = dict(self._sums), dict(self._k), len(self._open)
        drafts = sum(n for k, n in ks.items() if k > 0)
        return {name: sums.get(name, 0) for name in SUMMED.values()} | {
            "running": running,
            "waiting": 0,
            "progress": self.progress,
            "drafts": drafts,
            "k_chosen": dict(sorted(ks.items())),
            "accepted_per_position": {},
            "batch_sizes": {},
        }

    def cancel_all(self) -> None:
        with self._lock:
            gens = list(self._open)
        for gen in gens:
            gen.close()


class Frontend:
    """The ingress deployment (wrapped by `serve.ingress()` in app.py): the app, built once per replica."""

    def __init__(self, engine_handle, target: str, config: ServeConfig, max_batch: int):
        self.engine = RemoteEngine(engine_handle, Prompts.of_bundle(open_bundle(target)), max_batch)
        self.config = config

    def __serve_build_asgi_app__(self):
        return create_app(self.engine, self.config)
