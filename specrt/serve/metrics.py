"""Prometheus metrics of `specrt serve`, under a `specrt:` prefix (vLLM's and llama.cpp's names).

Two sources: the engine's own counters (rounds, speculation, batch, queue), read when /metrics is scraped,
so they can never disagree with the engine; and per-request observations the server makes as requests end
(outcome, time to first token, time per output token, end-to-end latency, tokens).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)


class EngineCollector:
    """Reads the engine's counters at scrape time."""

    def __init__(self, stats: Callable[[], dict]):
        self.stats = stats

    def collect(self):
        s = self.stats()
        yield GaugeMetricFamily("specrt:num_requests_running", "Requests holding a batch slot.", value=s["running"])
        yield GaugeMetricFamily("specrt:num_requests_waiting", "Requests queued for a slot.", value=s["waiting"])
        yield CounterMetricFamily(
            "specrt:engine_rounds", "Scheduler rounds (one batched verify pass each).", value=s["rounds"]
        )
        drafts = CounterMetricFamily("specrt:spec_decode_num_drafts", "Row-rounds that drafted.", value=s["drafts"])
        yield drafts
        yield CounterMetricFamily("specrt:spec_decode_num_draft_tokens", "Tokens drafted.", value=s["draft_tokens"])
        yield CounterMetricFamily(
            "specrt:spec_decode_num_accepted_tokens", "Drafted tokens the target accepted.", value=s["accepted_tokens"]
        )
        per_pos = CounterMetricFamily(
            "specrt:spec_decode_num_accepted_tokens_per_pos",
            "Drafted tokens accepted, by position in the draft (1-based).",
            labels=["position"],
        )
        for position, n in sorted(s["accepted_per_position"].items()):
            per_pos.add_metric([str(position)], n)
        yield per_pos
        k = CounterMetricFamily("specrt:spec_decode_k_chosen", "Row-rounds by the k drafted (0: plain).", labels=["k"])
        for value, n in sorted(s["k_chosen"].items()):
            k.add_metric([str(value)], n)
        yield k
        batch = CounterMetricFamily("specrt:batch_size", "Rounds by the number of rows decoding.", labels=["rows"])
        for rows, n in sorted(s["batch_sizes"].items()):
            batch.add_metric([str(rows)], n)
        yield batch
        yield CounterMetricFamily(  # vLLM's names: tokens looked up in the prefix cache, and found there
            "specrt:prefix_cache_queries", "Prompt tokens of admitted requests.", value=s.get("prompt_tokens", 0)
        )
        yield CounterMetricFamily(
            "specrt:prefix_cache_hits",
            "Prompt tokens found in the KV slot a request was given (not prefilled again).",
            value=s.get("cached_prompt_tokens", 0),
        )
        moved = CounterMetricFamily(
            "specrt:transfer_bytes", "Bytes copied between host and device (to_host: read back).", labels=["direction"]
        )
        moved.add_metric(["to_host"], s.get("bytes_to_host", 0))
        moved.add_metric(["to_device"], s.get("bytes_to_device", 0))
        yield moved


class Metrics:
    """The registry of one server."""

    def __init__(self, engine_stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine_stats))
        r = self.registry
        self.requests = Counter("specrt:requests", "Requests by outcome.", ["outcome"], registry=r)
        self.prompt_tokens = Counter("specrt:prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("specrt:generation_tokens", "Tokens generated.", registry=r)
        self.ttft = Histogram(
            "specrt:time_to_first_token_seconds", "Time to first token.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "specrt:time_per_output_token_seconds",
            "Time per output token after the first.",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specrt:e2e_request_latency_seconds", "End-to-end request latency.", buckets=LATENCY_BUCKETS, registry=r
        )

    def finished(self, outcome: str, prompt: int, generated: int, ttft: float | None, total: float) -> None:
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        if ttft is not None:
            self.ttft.observe(ttft)
            if generated > 1:
                self.tpot.observe((total - ttft) / (generated - 1))
        self.e2e.observe(total)
