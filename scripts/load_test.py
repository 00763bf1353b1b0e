#!/usr/bin/env python
"""Load test of any OpenAI-compatible server (specrt serve, llama-server, ...): a concurrency sweep or
Poisson arrivals, and a soak. Loopback only; every loop is bounded in count and time.

    python scripts/load_test.py sweep --url http://127.0.0.1:8000 --model qwen --concurrency 1 2 4 8 16
    python scripts/load_test.py poisson --url ... --rates 0.5 1 2 --requests 40
    python scripts/load_test.py soak --url ... --requests 500 --concurrency 8 --pid SERVER_PID
    python scripts/load_test.py suite --target engines/... --draft engines/...   # specrt vs itself vs llama-server

Each request is a streamed /v1/completions with a prompt from --prompts (JSON lines {"prompt": ...}) or a
built-in mixed set, `--max-tokens` new tokens (EOS ignored), fixed seeds. Reported per level: requests,
failures, request throughput, output tokens/s, TTFT / TPOT / ITL p50 and p99 (TPOT: per output token after
the first; ITL: between streamed chunks), and speculation (accepted / drafted, from specrt's usage
extension when the server gives it). Writes <out>/<name>.json, .md and .png.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import benchkit as kit

LIMIT_S = 1800.0  # no level runs longer than this


def prompts(path: Path | None) -> list[str]:
    if path is not None:
        return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    return [text for text, _, _ in kit.mixed_prompts(18)]


def loopback(url: str) -> str:
    host = url.split("//", 1)[-1].split("/", 1)[0].split(":")[0]
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"load tests run against loopback servers only; got {url}")
    return url.rstrip("/")


def one(url: str, model: str, prompt: str, max_tokens: int, seed: int, temperature: float, key: str | None) -> dict:
    """One streamed completion: its timings, token count and speculative usage (or its failure)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    t0 = time.perf_counter()
    stamps, usage = [], None
    try:
        with kit.post(url + "/v1/completions", body, 600, headers) as r:
            for data in kit.sse_events(r):
                if data.get("usage"):
                    usage = data["usage"]
                if any(c.get("text") for c in data.get("choices", [])):
                    stamps.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001 - counted as a failure
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:100]}", "s": time.perf_counter() - t0}
    end = time.perf_counter()
    tokens = (usage or {}).get("completion_tokens", len(stamps))
    return {
        "ok": True,
        "ttft": (stamps[0] if stamps else end) - t0,
        "s": end - t0,
        "tokens": tokens,
        "itl": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
        "speculative": (usage or {}).get("speculative"),
    }


def summarize(results: list[dict], wall: float) -> dict:
    ok = [r for r in results if r["ok"]]
    tokens = sum(r["tokens"] for r in ok)
    tpot = [(r["s"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    itl = [x for r in ok for x in r["itl"]]
    spec = [r["speculative"] for r in ok if r.get("speculative")]
    drafted = sum(s["drafted_tokens"] for s in spec)
    return {
        "requests": len(results),
        "failures": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if not r["ok"]})[:5],
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": tokens / wall,
        "ttft_p50": kit.percentile([r["ttft"] for r in ok], 0.5),
        "ttft_p99": kit.percentile([r["ttft"] for r in ok], 0.99),
        "tpot_p50": kit.percentile(tpot, 0.5),
        "tpot_p99": kit.percentile(tpot, 0.99),
        "itl_p50": kit.percentile(itl, 0.5),
        "itl_p99": kit.percentile(itl, 0.99),
        "acceptance": (sum(s["accepted_tokens"] for s in spec) / drafted) if drafted else None,
    }


def run_level(args, concurrency: int, n: int, rate: float | None = None) -> dict:
    """n requests: from `concurrency` client threads back to back, or (rate) Poisson arrivals."""
    return summarize(*run_requests(args, concurrency, n, rate=rate))


def run_requests(args, concurrency: int, n: int, first: int = 0, rate: float | None = None) -> tuple[list[dict], float]:
    """Requests first .. first + n - 1 (request i: prompt i and seed + i, so every server sees the same
    ones); their results and the wall time they took."""
    texts = prompts(args.prompts)
    rng = random.Random(args.seed + first)
    start = time.perf_counter()
    deadline = start + LIMIT_S

    def request(i: int) -> dict | None:
        if time.perf_counter() > deadline:
            return None
        return one(
            args.url, args.model, texts[i % len(texts)], args.max_tokens, args.seed + i, args.temperature, args.api_key
        )

    if rate is None:
        return kit.run_clients(request, range(first, first + n), concurrency, deadline)
    results, lock, threads = [], threading.Lock(), []

    def arrival(i: int) -> None:
        r = request(i)
        if r is not None:
            with lock:
                results.append(r)

    for i in range(first, first + n):
        time.sleep(rng.expovariate(rate))
        t = threading.Thread(target=arrival, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.perf_counter()))
    return results, time.perf_counter() - start


def soak(args) -> dict:
    """`--requests` at `--concurrency`, the server's RSS sampled every second."""
    samples, stop = [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), kit.rss_mib(args.pid)))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        level = run_level(args, args.concurrency[0], args.requests)
    finally:
        stop.set()
        sampler.join()
    values = [v for _, v in samples]
    warm = values[len(values) // 5 :] or values  # after warm-up: the first fifth
    growth = (max(warm[-10:]) - min(warm[:10])) / min(warm[:10]) if len(warm) >= 20 else float("nan")
    level |= {"rss_mib_first": values[0] if values else None, "rss_mib_last": values[-1] if values else None}
    level |= {"rss_growth_after_warmup": growth, "rss_samples": len(values)}
    with urllib.request.urlopen(args.url + "/health", timeout=10) as r:
        level["health_after"] = json.loads(r.read())
    return level


def bare_ttft(args, n: int) -> dict:
    """The same first n prompts through a bare in-process `engine.generate` (no HTTP, no server), one at a
    time: the reference for the server's time to first token at concurrency 1."""
    import specrt

    texts = prompts(args.prompts)
    engine = specrt.load(args.target, args.draft or None)
    ttfts = []
    for i in range(-1, n):  # -1: a warm-up, as the servers get
        options = specrt.GenerationOptions(
            max_new_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed + max(i, 0), ignore_eos=True
        )
        t0 = time.perf_counter()
        gen = engine.generate(texts[max(i, 0) % len(texts)], options)
        first = None
        for _ in gen:
            first = first or time.perf_counter()
        if i >= 0:
            ttfts.append((first or time.perf_counter()) - t0)
    del engine, gen
    gc.collect()  # its sessions and KV buffers: the servers measured next want the memory
    return {"config": "bare engine.generate (auto k)", "concurrency": 1, "ttft_p50": kit.percentile(ttfts, 0.5)}


# ---------------------------------------------------------------- the suite: specrt against itself and llama-server


def llama_servers(args, bin_dir: Path | None, concurrency: int) -> list[tuple[str, list[str]]]:
    """llama-server with -np c slots on the GGUF pair, plain and with its draft (none when not built)."""
    if bin_dir is None:
        return []
    c, alias = concurrency, ["--alias", args.model]
    return [
        (f"llama-server -np {c}", kit.llama_server_cmd(bin_dir, c, extra=alias)),
        (f"llama-server -np {c} + draft k=5", kit.llama_server_cmd(bin_dir, c, 5, extra=alias)),
    ]


class ServerDied(RuntimeError):
    """A server of the suite exited while its requests ran (its level's figures would be failures, not speed)."""


def died(name: str, proc: subprocess.Popen) -> ServerDied | None:
    """Why the server has exited, in one line (None: it runs). Killed by signal 9 with nobody asking is, on a
    machine without swap, almost always the kernel's out-of-memory killer: every specrt server holds its KV
    slots resident from load (--max-batch x max_seq_len positions, both models)."""
    code = proc.poll()
    if code is None:
        return None
    why = " (SIGKILL: most likely out of memory; fewer KV slots: --concurrency up to 8)" if code == -9 else ""
    return ServerDied(f"{name} (pid {proc.pid}) exited with code {code}{why}")


def alternate(args, servers: dict[str, tuple[subprocess.Popen, str]], c: int) -> dict[str, tuple[list, float]]:
    """One level, interleaved: max(rounds x c, --requests) requests split into --rounds parts (every part keeps
    c streams busy), every server (name -> (process, URL)) taking each part in turn, the order reversed every
    other part. Per server: results and wall time. ServerDied where a server exits during its part."""
    n = max(args.rounds * c, args.requests)
    parts = [n // args.rounds + (1 if i < n % args.rounds else 0) for i in range(args.rounds)]
    done: dict[str, tuple[list, float]] = {name: ([], 0.0) for name in servers}
    first = 0
    for rnd, part in enumerate(p for p in parts if p):
        for name in kit.interleave(servers, rnd):
            proc, args.url = servers[name]
            results, wall = run_requests(args, c, part, first)
            if (error := died(name, proc)) is not None:
                raise error
            done[name] = (done[name][0] + results, done[name][1] + wall)
        first += part
    return done


def suite(args) -> list[dict]:
    """specrt serve with auto k, with k = 0 and with fixed k, and llama-server with and without its draft,
    at each concurrency, INTERLEAVED: the three specrt servers run for the whole suite, the two llama-servers
    for each level (-np c); a level's requests are split into `--rounds` parts and every server takes each
    part in turn (order reversed every other part), so that this machine's drift falls on all of them alike.
    Every server gets the same requests (prompt i, seed + i) and one untimed warm-up: a server started cold
    whose first `--cold-burst` requests arrive together (its costs must be ready without a quiet moment).
    Each specrt server holds KV slots for the largest level from load, both models' (native pair at 16 slots:
    7.8 GiB resident a server, 23 GiB for the three); a server that dies (the out-of-memory killer) stops the
    suite at that level, the levels before it reported."""
    rows = []
    levels = args.concurrency
    if 1 in levels:
        bare = bare_ttft(args, max(2, args.requests))
        kit.log(f"bare engine.generate: ttft p50 {bare['ttft_p50']:.3f} s")
        rows.append(bare)
    specrt = [str(kit.SPECRT_CLI), "serve", "--target", args.target, "--max-batch", str(max(levels))]
    specrt += [*(["--draft", args.draft] if args.draft else []), "--model-name", args.model, "--max-queue", "1000"]
    fixed = [("specrt auto k", [*specrt, "-k", "auto"]), ("specrt k=0", [*specrt, "-k", "0"])]
    fixed.append((f"specrt k={args.fixed_k}", [*specrt, "-k", str(args.fixed_k)]))
    bin_dir = None if args.no_llamacpp else kit.llamacpp_bin()
    if bin_dir is None and not args.no_llamacpp:
        kit.log("llama.cpp is not built (bash scripts/build_llamacpp.sh): no llama-server rows")
    servers: dict[str, tuple[subprocess.Popen, str]] = {}

    def launch(name: str, cmd: list[str]) -> None:
        try:
            servers[name] = kit.start_server(cmd)
        except RuntimeError as e:
            sys.exit(str(e))
        args.url = servers[name][1]
        t0 = time.time()
        run_level(args, args.cold_burst, args.cold_burst)  # warm-up: the first requests arrive together
        kit.log(f"{name}: first {args.cold_burst} requests together took {time.time() - t0:.1f} s")
        kit.log(f"started {name}")

    try:
        for name, cmd in fixed:
            launch(name, cmd)
        for c in levels:
            per_level = llama_servers(args, bin_dir, c)
            for name, cmd in per_level:
                launch(name, cmd)
            names = [name for name, _ in fixed] + [name for name, _ in per_level]
            try:
                done = alternate(args, {name: servers[name] for name in names}, c)
            except ServerDied as e:  # the levels measured so far stand; this one's would be failures
                kit.log(f"stopped at concurrency {c}: {e}")
                rows.append({"config": "stopped", "concurrency": c, "error": str(e)})
                break
            for name in names:
                row = summarize(*done[name])
                rows.append({"config": name, "concurrency": c} | row)
                kit.log(
                    f"{name}, concurrency {c}: {row['output_tokens_per_s']:.1f} tok/s, ttft p50 "
                    f"{row['ttft_p50']:.2f} s, failures {row['failures']}"
                )
            for name, _ in per_level:
                kit.stop_server(servers.pop(name)[0])
    finally:
        for proc, _ in servers.values():
            kit.stop_server(proc)
    return rows


# ---------------------------------------------------------------- report


def report(rows: list[dict], command: str) -> str:
    md = [f"Command: `{command}`", ""]
    head = ["configuration", "concurrency", "req/s", "output tok/s", "TTFT p50 / p99 s", "TPOT p50 / p99 ms"]
    md.append("| " + " | ".join([*head, "ITL p50 / p99 ms", "failures", "acceptance"]) + " |")
    md.append("|---" * 9 + "|")
    for r in rows:
        if "requests" not in r:
            continue  # the bare-engine reference and a stop: in the lines below
        acc = "-" if r.get("acceptance") is None else f"{100 * r['acceptance']:.0f}%"
        md.append(
            f"| {r.get('config', '-')} | {r.get('concurrency', r.get('rate', '-'))} | {r['requests_per_s']:.2f} | "
            f"{r['output_tokens_per_s']:.1f} | {r['ttft_p50']:.2f} / {r['ttft_p99']:.2f} | "
            f"{1000 * r['tpot_p50']:.0f} / {1000 * r['tpot_p99']:.0f} | "
            f"{1000 * r['itl_p50']:.0f} / {1000 * r['itl_p99']:.0f} | "
            f"{r['failures']} | {acc} |"
        )
    return "\n".join(md + comparisons(rows)) + "\n"


def comparisons(rows: list[dict]) -> list[str]:
    """The suite's targets: auto k against the better of k = 0 and fixed k, against llama-server at the same
    concurrency, and the server's TTFT at concurrency 1 against a bare engine.generate."""
    tps = {
        (r["config"].split(" -np")[0] + (" + draft" if "draft" in r["config"] else ""), r.get("concurrency")): r[
            "output_tokens_per_s"
        ]
        for r in rows
        if "output_tokens_per_s" in r
    }
    fixed = next((c for c, _ in tps if c.startswith("specrt k=") and c != "specrt k=0"), None)
    out = ["", "Comparisons (output tokens/s ratios at the same concurrency):", ""]
    for c in sorted({c for _, c in tps if c is not None}):
        auto = tps.get(("specrt auto k", c))
        if auto is None:
            continue
        parts = []
        best = max((tps[k] for k in (("specrt k=0", c), (fixed, c)) if k in tps), default=None)
        if best:
            parts.append(f"auto / best of k=0 and {fixed}: {auto / best:.2f}")
        for peer in ("llama-server", "llama-server + draft"):
            if (peer, c) in tps:
                parts.append(f"auto / {peer}: {auto / tps[peer, c]:.2f}")
        out.append(f"- concurrency {c}: " + "; ".join(parts))
    bare = next((r for r in rows if r["config"].startswith("bare")), None)
    served = next((r for r in rows if r["config"] == "specrt auto k" and r.get("concurrency") == 1), None)
    if bare and served:
        ratio = served["ttft_p50"] / bare["ttft_p50"]
        out.append(
            f"- TTFT p50 at concurrency 1: served {served['ttft_p50']:.3f} s, bare engine.generate "
            f"{bare['ttft_p50']:.3f} s: {ratio:.2f}x"
        )
    for r in rows:
        if r["config"] == "stopped":
            out.append(f"- **Stopped at concurrency {r['concurrency']}**: {r['error']}; later levels not run")
    return out


def chart(rows: list[dict], path: Path) -> None:
    plt = kit.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 5))

    def family(config: str) -> str:  # llama-server levels have one process each: one line per kind
        return config.split(" -np")[0] + (" + draft" if "draft" in config else "")

    curves = {}
    for r in rows:
        if "concurrency" in r and "output_tokens_per_s" in r:
            curves.setdefault(family(r["config"]), []).append((r["concurrency"], r["output_tokens_per_s"]))
    for name, pts in curves.items():
        ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=name)
    kit.concurrency_axes(ax, "output tokens/s", 8)
    kit.save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["sweep", "poisson", "soak", "suite"])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--prompts", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", nargs="*", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--rates", nargs="*", type=float, default=[0.5, 1.0, 2.0])
    parser.add_argument("--requests", type=int, default=16, help="per level (sweep/poisson/suite), or the soak's total")
    parser.add_argument("--pid", type=int, default=None, help="soak: the server's process id (RSS sampling)")
    parser.add_argument("--target", default=str(kit.ROOT / "engines/qwen2.5-coder-1.5b-int4"))
    parser.add_argument("--draft", default=str(kit.ROOT / "engines/qwen2.5-coder-0.5b-int4"))
    parser.add_argument("--fixed-k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="suite: parts of each level the servers alternate on")
    parser.add_argument("--cold-burst", type=int, default=8, help="suite: warm-up requests arriving together")
    parser.add_argument(
        "--no-llamacpp",
        action="store_true",
        help="suite: specrt servers only (each specrt server holds its KV slots from load: at 16 streams the three"
        " native ones take 23 GiB, with two llama-servers more)",
    )
    parser.add_argument("--out", type=Path, default=kit.ROOT / "results/serve")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    command = kit.command_line()
    if args.mode == "suite":
        rows = suite(args)
    else:
        args.url = loopback(args.url)
        if args.mode == "sweep":
            rows = [
                {"config": args.url, "concurrency": c} | run_level(args, c, max(args.requests, 2 * c))
                for c in args.concurrency
            ]
        elif args.mode == "poisson":
            rows = [{"config": args.url, "rate": rate} | run_level(args, 0, args.requests, rate) for rate in args.rates]
        else:
            if args.pid is None:
                sys.exit("soak needs --pid (the server's process id)")
            rows = [{"config": f"soak {args.requests} requests", "concurrency": args.concurrency[0]} | soak(args)]
    md = report(rows, command)
    kit.write_outputs(args.out, args.mode, md, {"command": command, "rows": rows}, lambda path: chart(rows, path))
    return 1 if any(r["config"] == "stopped" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
