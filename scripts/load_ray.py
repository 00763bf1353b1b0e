#!/usr/bin/env python
"""Load test of specrt on Ray Serve (specrt/scale/) against `specrt serve`, on one machine, loopback only.

    python scripts/load_ray.py --out results/ray            # about 20 minutes on 2 cores (int4 pair)

One local Ray cluster holds four applications of the same bundles, and `specrt serve` runs beside it:
- "serve, 2 threads": `specrt serve --threads 2` (the reference);
- "ray 1x2": Ray Serve, 1 replica of 2 threads (the Ray layer's cost: the same engine behind Serve's
  proxy, a front end replica and a handle);
- "ray 1x1" and "ray 2x1": 1 and 2 replicas of 1 thread each (replica scaling on 2 cores shows correctness
  and overheads, not speedups: two replicas share the cores one server had);
- "ray 2x1 pow2": 2 replicas under Ray Serve's default router, for the conversation workload.

Sweep: at each concurrency, `--requests` streamed completions (the mixed prompts, `--max-tokens`, EOS
ignored, greedy) split into `--rounds` parts that every configuration takes in turn (order reversed every
other part), so this machine's drift falls on all alike: throughput, TTFT and ITL p50 / p99.

Conversations: `--conversations` chats run at once, each `--turns` turns long, every turn's prompt the whole
history so far (a system prompt, the earlier questions and answers, the new question): the affinity router
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


def start_ray(args) -> dict[str, str]:
    """The local cluster and its applications; returns name -> base URL."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    import specrt
    from specrt.scale.app import ScaleConfig, build
    from specrt.serve.protocol import Defaults
    from specrt.serve.server import ServeConfig

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
    config = ServeConfig(args.model, max_queue=1000, defaults=Defaults(max_tokens=args.max_tokens, temperature=0.0))
    apps = {"ray 1x2": (1, 2, "affinity"), "ray 1x1": (1, 1, "affinity"), "ray 2x1": (2, 1, "affinity")}
    apps["ray 2x1 pow2"] = (2, 1, "pow2")
    urls = {}
    for i, (name, (replicas, threads, router)) in enumerate(apps.items()):
        loader = functools.partial(specrt.load, args.target, args.draft, threads=threads, max_batch=args.max_batch)
        c = ScaleConfig(args.target, loader, config, args.max_batch, replicas, router=router)
        kit.log(f"deploying {name}")
        serve.run(build(c), name=f"app{i}", route_prefix=f"/app{i}")
        urls[name] = f"http://127.0.0.1:{port}/app{i}"
    return urls


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
    """`args.conversations` chats at once, each turn waiting for the last answer."""

    def chat(i: int) -> list[dict]:
        history, turns = f"{SYSTEM}(conversation {seed}-{i})\n", []
        for t in range(args.turns):
            history += f"User: {QUESTIONS[(i + t) % len(QUESTIONS)]}\nAssistant:"
            turn = chat_turn(url, args.model, history, args.chat_tokens)
            history += turn["text"] + "\n"
            turns.append(turn | {"turn": t})
        return turns

    results, _ = kit.run_clients(chat, range(args.conversations), args.conversations)
    return [turn for turns in results for turn in turns]


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
    md = [f"Command: `{command}`", "", load_test.report(sweep_rows, command).split("\n", 2)[2]]
    ref = {r["concurrency"]: r for r in sweep_rows if r["config"] == "ray 1x2"}
    base = {r["concurrency"]: r for r in sweep_rows if r["config"].startswith("serve")}
    for c in sorted(ref):
        if c in base:
            md.append(
                f"- c = {c}: Ray 1 replica of 2 threads / specrt serve (2 threads): throughput "
                f"{ref[c]['output_tokens_per_s'] / base[c]['output_tokens_per_s']:.3f}, TTFT p50 "
                f"{1000 * (ref[c]['ttft_p50'] - base[c]['ttft_p50']):+.0f} ms"
            )
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
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--chat-tokens", type=int, default=24)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--out", default=str(kit.ROOT / "results/ray"))
    args = parser.parse_args()
    args.prompts, args.seed, args.temperature, args.api_key = None, 0, 0.0, None
    serve_cmd = [str(kit.SPECRT_CLI), "serve", "--target", args.target, "--draft", args.draft, "--threads", "2"]
    serve_cmd += ["--max-batch", str(args.max_batch), "--model-name", args.model, "--max-queue", "1000"]
    server = None
    try:
        urls = start_ray(args)
        server, urls["serve, 2 threads"] = kit.start_server(serve_cmd)
        for name, url in urls.items():  # one untimed request each: first runs, cost profiles read
            args.url = url
            load_test.run_requests(args, 1, 1, 10_000)
            kit.log(f"warmed {name}")
        names = ["serve, 2 threads", "ray 1x2", "ray 1x1", "ray 2x1"]
        sweep_rows = [] if args.no_sweep else sweep(args, urls, names)
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
