"""The engine replica: one specrt Engine per Ray Serve replica, its generations streamed back to the front end.

`generate(job)` is an async generator (Ray Serve cancels an async generator at its next await when the
caller goes away; a synchronous one would run to its end): a thread reads the engine's Generation into a
queue, and the generator hands over everything ready at once, so that a message crosses the handle per
wait rather than per token (each message costs the replica and the front end CPU the engine needs). What
it yields: ("piece", text, new token ids), then ("end", finish reason, the generation's stats with this
replica's id). A cancelled or failed call closes
the Generation, so its KV slot is free before the engine's next round.

Health: Ray Serve calls `check_health` every `health_check_period_s`; it fails while the engine has work
and its scheduler has not finished a round for `stall_s` (three failures in a row and Ray Serve replaces
the replica). Metrics: every `metrics_interval_s` the engine's counters go to Ray's metrics (Prometheus
names `ray_specrt_*`, tagged with the deployment and replica by Ray Serve) for an operator to scrape.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from ray import serve
from ray.serve.metrics import Counter, Gauge

from ..options import GenerationOptions
from ..serve.progress import STALL_S, Progress

_DONE = object()


def _read(gen, ready: queue.SimpleQueue, failed: list) -> None:
    """The generation's pieces, with the token ids each brought, into `ready` as the scheduler commits them
    (a thread of its own: the replica's event loop hands each message over while the next tokens come)."""
    sent = 0
    try:
        for piece in gen:
            ids = gen.token_ids[sent:]
            sent += len(ids)
            ready.put((piece, ids))
        ids = gen.token_ids[sent:]
        if ids:  # tokens that brought no text (held back, or a stop string)
            ready.put(("", ids))
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        failed.append(e)
    finally:
        ready.put(_DONE)


COUNTERS = {  # engine stats key -> (metric name, description)
    "rounds": ("specrt_engine_rounds", "Scheduler rounds (one batched verify pass each)."),
    "draft_tokens": ("specrt_draft_tokens", "Tokens drafted."),
    "accepted_tokens": ("specrt_accepted_tokens", "Drafted tokens the target accepted."),
    "prompt_tokens": ("specrt_prompt_tokens", "Prompt tokens of admitted requests."),
    "cached_prompt_tokens": ("specrt_cached_prompt_tokens", "Prompt tokens found in a KV slot (not prefilled)."),
    "generated_tokens": ("specrt_generated_tokens", "Tokens generated."),
}
GAUGES = {
    "running": ("specrt_requests_running", "Requests holding a batch slot."),
    "waiting": ("specrt_requests_waiting", "Requests queued for a slot."),
}


@dataclass
class Job:
    """One generation for an engine replica: checked prompt ids (the front end checked them) and options."""

    prompt_ids: list[int]
    options: GenerationOptions


class EngineReplica:
    def __init__(self, loader: Callable, stall_s: float = STALL_S, metrics_interval_s: float = 5.0):
        self.engine = loader()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.progress = Progress(stall_s)
        self._stop = threading.Event()
        if metrics_interval_s > 0:  # the metrics made here, where Ray Serve's replica context is known
            counters = {key: Counter(name, description) for key, (name, description) in COUNTERS.items()}
            gauges = {key: Gauge(name, description) for key, (name, description) in GAUGES.items()}
            args = (metrics_interval_s, counters, gauges)
            threading.Thread(target=self._publish, args=args, daemon=True).start()

    async def generate(self, job: Job) -> AsyncIterator[tuple]:
        gen = self.engine.generate(job.prompt_ids, job.options)
        ready: queue.SimpleQueue = queue.SimpleQueue()
        failed: list[BaseException] = []
        threading.Thread(target=_read, args=(gen, ready, failed), daemon=True).start()
        try:
            while True:
                item = await anyio.to_thread.run_sync(ready.get, abandon_on_cancel=True)
                items = [item]
                while item is not _DONE and not ready.empty():  # whatever else is ready goes in one message
                    item = ready.get_nowait()
                    items.append(item)
                pieces = [i for i in items if i is not _DONE]
                if pieces:
                    yield ("piece", "".join(t for t, _ in pieces), [x for _, ids in pieces for x in ids])
                if item is _DONE:
                    break
            if failed:
                raise failed[0]
            stats = gen.stats.to_dict() | {"replica": self.replica}
            yield ("end", gen.finish_reason, stats)
        finally:  # cancelled (the client went away) or failed: free the slot now, wake a waiting get
            gen.close()
            ready.put(_DONE)

    def check_health(self) -> None:
        s = self.engine.stats
        stalled = self.progress.stalled_for(s["rounds"], bool(s["running"] or s["waiting"]))
        if stalled is not None:
            raise RuntimeError(f"the scheduler has made no progress for {stalled:.0f} s with work queued")

    def stats(self) -> dict:
        """The engine's counters, with this replica's id."""
        return self.engine.stats | {"replica": self.replica}

    def _publish(self, interval: float, counters: dict, gauges: dict) -> None:
        last = dict.fromkeys(COUNTERS, 0)
        while not self._stop.wait(interval):
            s = self.engine.stats
            for key, counter in counters.items():
                if s.get(key, 0) > last[key]:
                    counter.inc(s[key] - last[key])
                    last[key] = s[key]
            for key, gauge in gauges.items():
                gauge.set(s[key])

    def __del__(self) -> None:
        self._stop.set()
