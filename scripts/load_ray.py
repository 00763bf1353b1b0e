#!/usr/bin/env python
"""Load test of specrt on Ray Serve (specrt/scale/) against `specrt serve`, on one machine, loopback only.

    python scripts/load_ray.py --out results/ray            # about 20 minutes on 2 cores (int4 pair)

One local Ray cluster holds three applications of the same bundles, and `specrt serve` runs beside it:
- "serve, 2 threads": `specrt serve --threads 2` (the reference);
- "ray 1x2": Ray Serve, 1 replica of 2 threads (the Ray layer's cost: the same engine behind Serve's
  proxy, a front end replica and a handle);
- "ray 2x1": 2 replicas of 1 thread each (replica scaling on 2 cores shows correctness and overheads, not
  speedups: two replicas share the cores one server had);
- "ray 2x1 pow2": 2 replicas under Ray Serve's default router, for the conversation workload.

Sweep: at each concurrency, `--requests` streamed completions (the mixed prompts, `--max-tokens`, EOS
ignored, greedy) split into `--rounds` parts that every configuration takes in turn (order reversed every
other part), so this machine's drift falls on all alike: throughput, TTFT and ITL p50 / p99.

Conversations: `--conversations` chats, each `--turns` turns long, every turn's prompt the whole history so
far (a system prompt, the earlier questions and answers, the new question), `--parallel` turns in flight at
once (more chats than requests in flight, as with many users; with as many in flight as the replicas have
slots, a full replica forces each chat back to the one holding it, whatever the router): the affinity router
(the replica holding the history's prefix) against Ray's power-of-two router, alternating rounds. Counted:
TTFT p50 / p99 and prompt tokens actually prefilled (usage.prompt_tokens - prompt_tokens_details.cached_tokens).
Writes <out>/ray.json, ray.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import benchkit as kit
import load_test

SYSTEM = (
    "You are a senior Python engineer. Answer with short, correct code and one sentence of explanation. "
    "Prefer the standard library; type-annotate functions; never use global state. "
)
QUESTIONS = [
    "Write a function that merges two sorted lists.",
    "Now make it work for any number of lists.",
    "Add a docstring and a doctest.",
    "How would you test it with pytest?",
    "Make it lazy, as a generator.",
    "What is its time complexity?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


APPS = {  # name -> (replicas, threads per replica, router)
    "ray 1x2": (1, 2, "affinity"),
    "ray 2x1": (2, 1, "affinity"),
    "ray 2x1 pow2": (2, 1, "pow2"),
}


def start_ray(niceness: int | None) -> str:
    """The local cluster (its workers at `niceness`: Ray's default is 15) and Serve's proxy; returns its URL."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    system = {} if niceness is None else {"_system_config": {"worker_niceness": niceness}}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, **system)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
    return f"http://127.0.0.1:{port}"


def deploy(args, base: str, name: str) -> str:
    """One application of APPS under /app<i>; returns its URL once it answered one untimed request."""
    from ray import serve

    import specrt
    from specrt.scale.app import ScaleConfig, build
    from specrt.serve.protocol import Defaults
    from specrt.serve.server import ServeConfig

    replicas, threads, router = APPS[name]
    defaults = Defaults(max_tokens=args.max_tokens, temperature=0.0, num_draft_tokens=args.num_draft_tokens)
    config = ServeConfig(args.model, max_queue=1000, defaults=defaults)
    loader = functools.partial(specrt.load, args.target, args.draft, threads=threads, max_batch=args.max_batch)
    c = ScaleConfig(args.target, loader, config, args.max_batch, replicas, router=router)
    route = f"app{list(APPS).index(name)}"
    serve.run(build(c), name=route, route_prefix=f"/{route}")
    return warm(args, name, f"{base}/{route}", replicas)


def warm(args, name: str, url: str, replicas: int) -> str:
    """Untimed: first runs, cost profiles read (or measured); one request per replica, at once."""
    args.url = url
    load_test.run_requests(args, replicas, replicas, 10_000)
    kit.log(f"warmed {name}")
    return url


def sweep(args, urls: dict[str, str], names: list[str]) -> list[dict]:
    rows = []
    for c in args.concurrency:
        done = load_test.alternate(args, {name: urls[name] for name in names}, c)
        for name in names:
            row = {"config": name, "concurrency": c} | load_test.summarize(*done[name])
            rows.append(row)
            kit.log(f"{name} c={c}: {row['output_tokens_per_s']:.1f} tok/s, ttft p50 {row['ttft_p50']:.2f} s")
    return rows


def chat_turn(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    t0, first, text, usage = time.perf_counter(), None, [], {}
    with kit.post(url + "/v1/completions", body, 600) as r:
        for data in kit.sse_events(r):
            usage = data.get("usage") or usage
            for choice in data.get("choices", []):
                if choice.get("text"):
                    first = first or time.perf_counter()
                    text.append(choice["text"])
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "ttft": (first or time.perf_counter()) - t0,
        "text": "".join(text),
        "prompt": usage["prompt_tokens"],
        "prefilled": usage["prompt_tokens"] - cached,
        "replica": usage.get("replica"),
    }


def conversations(args, url: str, seed: int) -> list[dict]:
    """`args.conversations` chats, turn by turn: at each turn every chat asks its next question, from
    `args.parallel` client threads (more chats than requests in flight, as with many users)."""
    history = [f"{SYSTEM}(conversation {seed}-{i})\n" for i in range(args.conversations)]
    turns = []
    for t in range(args.turns):

        def turn(i: int, t: int = t) -> dict:
            history[i] += f"User: {QUESTIONS[(i + t) % len(QUESTIONS)]}\nAssistant:"
            got = chat_turn(url, args.model, history[i], args.chat_tokens)
            history[i] += got["text"] + "\n"
            return got | {"turn": t}

        results, _ = kit.run_clients(turn, range(args.conversations), args.parallel)
        turns += results
    return turns


def conversation_rows(args, urls: dict[str, str]) -> list[dict]:
    names = ["ray 2x1", "ray 2x1 pow2"]
    turns: dict[str, list[dict]] = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in kit.interleave(names, rnd):
            turns[name] += conversations(args, urls[name], 1000 * rnd)
    rows = []
    for name in names:
        got = turns[name]
        later = [t for t in got if t["turn"] > 0]
        rows.append(
            {
                "config": name,
                "turns": len(got),
                "prompt_tokens": sum(t["prompt"] for t in got),
                "prefilled_tokens": sum(t["prefilled"] for t in got),
                "ttft_p50": kit.percentile([t["ttft"] for t in got], 0.5),
                "ttft_p99": kit.percentile([t["ttft"] for t in got], 0.99),
                "later_turns_ttft_p50": statistics.median(t["ttft"] for t in later) if later else None,
            }
        )
        kit.log(f"{name}: prefilled {rows[-1]['prefilled_tokens']} of {rows[-1]['prompt_tokens']} prompt tokens")
    return rows


def report(sweep_rows: list[dict], chat_rows: list[dict], command: str) -> str:
    md = [f"Command: `{command}`", ""]
    if sweep_rows:
        md.append(load_test.report(sweep_rows, command).split("\n", 2)[2])
    ref = {r["concurrency"]: r for r in sweep_rows if r["config"] == "ray 1x2"}
    base = {r["concurrency"]: r for r in sweep_rows if r["config"].startswith("serve")}
    for c in sorted(ref):
        if c in base:
            md.append(
                f"- c = {c}: Ray 1 replica of 2 threads / specrt serve (2 threads): throughput "
                f"{ref[c]['output_tokens_per_s'] / base[c]['output_tokens_per_s']:.3f}, TTFT p50 "
                f"{1000 * (ref[c]['ttft_p50'] - base[c]['ttft_p50']):+.0f} ms"
            )
    if not chat_rows:
        return "\n".join(md) + "\n"
    md += ["", "Conversations (every turn's prompt is the whole history so far):", ""]
    md += [
        "| router | turns | prompt tokens | prefilled | TTFT p50 / p99 s | later turns TTFT p50 s |",
        "|---" * 6 + "|",
    ]
    for r in chat_rows:
        later = "-" if r["later_turns_ttft_p50"] is None else f"{r['later_turns_ttft_p50']:.2f}"
        md.append(
            f"| {r['config']} | {r['turns']} | {r['prompt_tokens']} | {r['prefilled_tokens']} | "
            f"{r['ttft_p50']:.2f} / {r['ttft_p99']:.2f} | {later} |"
        )
    if len(chat_rows) == 2 and chat_rows[0]["prefilled_tokens"]:
        a, b = chat_rows
        md.append(f"\nPrefill work, default router / affinity: {b['prefilled_tokens'] / a['prefilled_tokens']:.2f}x")
    return "\n".join(md) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(kit.ROOT / "engines/qwen2.5-coder-1.5b-int4"))
    parser.add_argument("--draft", default=str(kit.ROOT / "engines/qwen2.5-coder-0.5b-int4"))
    parser.add_argument("--model", default="qwen")
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", nargs="*", type=int, default=[1, 4])
    parser.add_argument("--requests", type=int, default=8, help="per level")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=4, help="conversation turns in flight at once")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--chat-tokens", type=int, default=24)
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="every engine's k (default: auto, whose choices may differ between two engines of the same pair)",
    )
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--no-conversations", action="store_true")
    parser.add_argument("--worker-niceness", type=int, help="Ray workers' (Ray's default: 15)")
    parser.add_argument("--out", default=str(kit.ROOT / "results/ray"))
    args = parser.parse_args()
    args.prompts, args.seed, args.temperature, args.api_key = None, 0, 0.0, None
    serve_cmd = [str(kit.SPECRT_CLI), "serve", "--target", args.target, "--draft", args.draft, "--threads", "2"]
    serve_cmd += ["--max-batch", str(args.max_batch), "--model-name", args.model, "--max-queue", "1000"]
    if args.num_draft_tokens is not None:
        serve_cmd += ["--num-draft-tokens", str(args.num_draft_tokens)]
    # In two phases: every engine holds max_batch full-length KV slots of both models (about 3 GB for the
    # int4 pair), so the five engines of all configurations at once would not fit in 24 GiB.
    server, sweep_rows = None, []
    try:
        base = start_ray(args.worker_niceness)
        from ray import serve

        urls = {"ray 2x1": deploy(args, base, "ray 2x1")}
        if not args.no_sweep:
            server, url = kit.start_server(serve_cmd)
            urls["serve, 2 threads"] = warm(args, "serve, 2 threads", url, 1)
            urls["ray 1x2"] = deploy(args, base, "ray 1x2")
            sweep_rows = sweep(args, urls, ["serve, 2 threads", "ray 1x2", "ray 2x1"])
            kit.stop_server(server)
            server = None
            serve.delete(f"app{list(APPS).index('ray 1x2')}")
        chat_rows = []
        if not args.no_conversations:
            urls["ray 2x1 pow2"] = deploy(args, base, "ray 2x1 pow2")
            chat_rows = conversation_rows(args, urls)
    finally:
        if server is not None:
            kit.stop_server(server)
        import ray
        from ray import serve

        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
    command = kit.command_line()
    data = {"command": command, "sweep": sweep_rows, "conversations": chat_rows}
    kit.write_outputs(Path(args.out), "ray", report(sweep_rows, chat_rows, command), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
