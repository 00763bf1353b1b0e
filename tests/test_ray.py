"""specrt on Ray Serve (specrt/scale/), on a local Ray cluster bound to loopback, with tiny bundles: the same
OpenAI routes as `specrt serve` through Serve's HTTP proxy, greedy output equal to one engine's, requests
spread over two replicas, prefix affinity (and its absence under Ray's default router), a replica killed
under load, autoscaling, and each replica's counters in Ray's metrics. Opt-in (`-m ray`; CI runs it): a
cluster takes ~15 s to start and the whole module about two minutes on 2 cores."""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import import_or_skip

pytestmark = pytest.mark.ray
ray = import_or_skip("ray")
openai = import_or_skip("openai")

import specrt  # noqa: E402
from specrt import GenerationOptions  # noqa: E402
from specrt.serve.protocol import Defaults  # noqa: E402
from specrt.serve.server import ServeConfig  # noqa: E402

MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    os.environ.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S="0.5",
        RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S="0.5",
    )
    metrics_port, http_port = free_port(), free_port()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        _metrics_export_port=metrics_port,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": http_port}, logging_config={"log_level": "WARNING"})
    yield {"url": f"http://127.0.0.1:{http_port}", "metrics": f"http://127.0.0.1:{metrics_port}/metrics"}
    serve.shutdown()
    ray.shutdown()


def deploy(zoo, cluster, name: str, **options) -> str:
    """An application of the tiny pair under /<name>; returns its OpenAI base URL."""
    from ray import serve

    from specrt.scale.app import ScaleConfig, build

    options = {"replicas": 2, "max_batch": 4, "health_check_period_s": 1.0, "metrics_interval_s": 1.0} | options
    target, draft = str(zoo.target()), str(zoo.noisy_draft())
    loader = functools.partial(specrt.load, target, draft, threads=1, max_batch=options["max_batch"])
    config = ServeConfig(MODEL, max_queue=64, defaults=Defaults(max_tokens=16, temperature=0.0))
    serve.run(build(ScaleConfig(str(zoo.target()), loader, config, **options)), name=name, route_prefix=f"/{name}")
    return f"{cluster['url']}/{name}/v1"


def client(url: str):
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def running_replicas(app: str) -> int:
    from ray import serve

    from specrt.scale.app import ENGINE

    return serve.status().applications[app].deployments[ENGINE].replica_states.get("RUNNING", 0)


@pytest.fixture(scope="module")
def engine(zoo):
    return specrt.load(zoo.target(), zoo.noisy_draft(), max_batch=4)


@pytest.fixture(scope="module")
def two(zoo, cluster):
    return deploy(zoo, cluster, "two")


def greedy(engine, prompt: str, n: int, chat: bool = False):
    return engine.complete(prompt, GenerationOptions(max_new_tokens=n, ignore_eos=True), chat=chat)


def ask(c, prompt: str, n: int, **kw):
    return c.completions.create(
        model=MODEL, prompt=prompt, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}, **kw
    )


def test_two_replicas_answer_as_one_engine_does(two, engine):
    c = client(two)
    expected = greedy(engine, "def fibonacci(n):", 12)
    out = ask(c, "def fibonacci(n):", 12)
    assert out.choices[0].text == expected.text and out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == len(expected.prompt_ids)
    chunks = list(ask(c, "def fibonacci(n):", 12, stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 12
    chat = greedy(engine, "hello there", 10, chat=True)
    messages = [{"role": "user", "content": "hello there"}]
    kw = {"model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
    assert c.chat.completions.create(**kw).choices[0].message.content == chat.text
    deltas = list(c.chat.completions.create(stream=True, **kw))
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == chat.text
    assert [m.id for m in c.models.list().data] == [MODEL]
    # A bad request gets the same OpenAI-shaped error as from `specrt serve`.
    with pytest.raises(openai.BadRequestError, match="prompt token id 99999"):
        c.completions.create(model=MODEL, prompt=[99999], max_tokens=2)


def test_sixteen_concurrent_requests_spread_over_both_replicas(two, engine):
    prompts = [f"def f{i}(x):" + " y" * (i % 5) for i in range(16)]
    expected = {p: greedy(engine, p, 20 + i % 7).text for i, p in enumerate(prompts)}
    c = client(two)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: (prompts[i], ask(c, prompts[i], 20 + i % 7)), range(16)))
    for p, out in results:
        assert out.choices[0].text == expected[p], p
    replicas = [out.usage.model_extra["replica"] for _, out in results]
    counts = {r: replicas.count(r) for r in set(replicas)}
    assert len(counts) == 2 and min(counts.values()) >= 3, counts


def test_each_replicas_counters_reach_rays_metrics(two, cluster):
    ask(client(two), "def g(x):", 8)
    deadline, seen = time.time() + 40, {}
    while time.time() < deadline:
        with urllib.request.urlopen(cluster["metrics"], timeout=10) as r:
            lines = [line for line in r.read().decode().splitlines() if line.startswith("ray_specrt_generated_tokens")]
        seen = {
            line.split('replica="')[1].split('"')[0]: float(line.split()[-1]) for line in lines if "replica=" in line
        }
        if len(seen) == 2 and sum(seen.values()) > 0:
            break
        time.sleep(1)
    assert len(seen) == 2 and sum(seen.values()) > 0, seen


def test_a_request_done_before_ray_reports_it_routed_is_not_left_in_flight():
    """Ray reports a request's completion from a callback registered before the replica accepts it, so a
    short request can be reported done before it is reported routed: the router's count must still return
    to zero (a count kept by those two hooks leaked one request per race, and the replica believed busy got
    no new conversations)."""
    import asyncio
    from types import SimpleNamespace

    from specrt.scale.router import AffinityRouter

    class Result:  # a ReplicaResult's done-callback, fired at once when it is already done (as Ray's are)
        def __init__(self, done: bool):
            self.done, self.callbacks = done, []

        def add_done_callback(self, cb):
            cb(self) if self.done else self.callbacks.append(cb)

        def finish(self):
            self.done = True
            for cb in self.callbacks:
                cb(self)

    async def scenario():
        router = AffinityRouter.__new__(AffinityRouter)  # Ray builds it with its own arguments; not needed
        router.initialize_state()
        job = SimpleNamespace(prompt_ids=list(range(40)))
        pending = [SimpleNamespace(args=[job], metadata=SimpleNamespace(internal_request_id=str(i))) for i in range(3)]
        # 0: reported done before routed; 1: routed, then done; 2: still running.
        router.on_request_completed("a", "0")
        router.on_request_routed(pending[0], "a", Result(done=True))
        slow, running = Result(done=False), Result(done=False)
        router.on_request_routed(pending[1], "a", slow)
        router.on_request_routed(pending[2], "b", running)
        await asyncio.sleep(0.01)
        during = dict(router.load)
        slow.finish()
        router.on_request_completed("a", "1")
        await asyncio.sleep(0.01)
        return during, dict(router.load)

    during, after = asyncio.run(scenario())
    assert during == {"a": 1, "b": 1}
    assert after == {"a": 0, "b": 1}


def shared_prefix_run(url: str, n: int = 12) -> dict:
    """n requests, one after another, sharing a long prefix: replica -> count."""
    c = client(url)
    system = "You are a careful assistant. " * 8
    replicas = [ask(c, system + f"question {i}:", 4).usage.model_extra["replica"] for i in range(n)]
    return {r: replicas.count(r) for r in set(replicas)}


def conversations_run(url: str, chats: int = 8, turns: int = 3) -> tuple[int, int]:
    """`chats` conversations, one turn each in turn, every prompt the conversation's whole history: more
    histories than one replica has slots (4), as many as two have. Prompt tokens, and those prefilled."""
    c = client(url)
    history = [f"Conversation {i} about topic {i * 7}. " * 6 for i in range(chats)]
    prompt = prefilled = 0
    for t in range(turns):
        for i in range(chats):
            history[i] += f"Question {t}:"
            out = ask(c, history[i], 6)
            history[i] += out.choices[0].text
            prompt += out.usage.prompt_tokens
            prefilled += out.usage.prompt_tokens - out.usage.prompt_tokens_details.cached_tokens
    return prompt, prefilled


def test_prefix_affinity_keeps_a_shared_prefix_on_one_replica(two, zoo, cluster):
    counts = shared_prefix_run(two)
    assert len(counts) == 1, counts  # all on the replica holding the prefix
    prompt, prefilled = conversations_run(two)
    default = deploy(zoo, cluster, "pow2", router="pow2")
    counts_default = shared_prefix_run(default)
    assert len(counts_default) == 2, counts_default  # Ray's default spreads them (all on one: p = 1/2048)
    prompt_default, prefilled_default = conversations_run(default)
    assert prompt == prompt_default  # the same conversations (greedy)...
    assert prefilled_default > 1.5 * prefilled, (prefilled, prefilled_default)  # ...at less prefill work
    from ray import serve

    serve.delete("pow2")


def test_a_shared_prefix_gives_way_when_its_replica_is_busy(two):
    c = client(two)
    system = "Shared context for everyone. " * 8
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: ask(c, system + f"item {i}:", 40), range(8)))
    assert len({out.usage.model_extra["replica"] for out in outs}) == 2


def stream(url: str, prompt: str, n: int, deadline_s: float) -> str:
    """One raw SSE completion: "done" (finish chunk then [DONE]), "error" (an error event), or "hung"."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(f"{url}/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    outcome = "hung"
    try:
        with urllib.request.urlopen(req, timeout=deadline_s) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    outcome = "error"
                elif event["choices"] and event["choices"][0]["finish_reason"] == "length":
                    outcome = "done"
    except OSError:
        outcome = "error" if outcome == "hung" else outcome
    return outcome


def replaced(app: str, victim: str, timeout: float) -> bool:
    """The killed replica gone and two replicas running, seen three polls in a row (Serve's status may still
    count a dead replica as running until its controller notices)."""
    from specrt.scale.app import ENGINE

    deadline, steady = time.time() + timeout, 0
    while time.time() < deadline and steady < 3:
        try:
            ray.get_actor(f"SERVE_REPLICA::{app}#{ENGINE}#{victim}", namespace="serve")
            gone = False
        except ValueError:
            gone = True
        steady = steady + 1 if gone and running_replicas(app) == 2 else 0
        time.sleep(0.5)
    return steady >= 3


def test_a_replica_killed_under_load_is_replaced_and_only_its_requests_fail(zoo, cluster):
    from ray import serve

    from specrt.scale.app import ENGINE

    url = deploy(zoo, cluster, "kill")
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(stream(url, f"def h{i}(x):", 200, 90))) for i in range(16)
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the streams are under way
    victim = serve.get_deployment_handle(ENGINE, "kill").stats.remote().result()["replica"]
    ray.kill(ray.get_actor(f"SERVE_REPLICA::kill#{ENGINE}#{victim}", namespace="serve"), no_restart=True)
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 16 and "hung" not in results, results
    assert results.count("done") >= 4, results  # the other replica's requests went on
    assert replaced("kill", victim, 60)
    with ThreadPoolExecutor(16) as pool:
        after = list(pool.map(lambda i: stream(url, f"def k{i}(x):", 30, 60), range(16)))
    assert after == ["done"] * 16, after
    serve.delete("kill")


def test_a_burst_scales_the_replicas_up_and_they_fall_back_after(zoo, cluster):
    from ray import serve

    url = deploy(
        zoo, cluster, "auto", replicas=2, min_replicas=1, max_batch=1, upscale_delay_s=1.0, downscale_delay_s=4.0
    )
    assert running_replicas("auto") == 1
    peak, stop = [1], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], running_replicas("auto"))
            time.sleep(0.25)

    watcher = threading.Thread(target=watch)
    watcher.start()
    deadline = time.time() + 60
    with ThreadPoolExecutor(6) as pool:
        while peak[0] < 2 and time.time() < deadline:
            list(pool.map(lambda i: stream(url, f"def b{i}(x):", 200, 90), range(6)))
    stop.set()
    watcher.join()
    assert peak[0] == 2
    deadline = time.time() + 90
    while running_replicas("auto") > 1 and time.time() < deadline:
        time.sleep(1)
    assert running_replicas("auto") == 1
    serve.delete("auto")


def test_specrt_serve_ray_bad_flags_are_one_line(capsys, zoo):
    from test_errors import assert_one_line_error, run_cli

    base = ["serve", "--ray", "--target", zoo.target()]
    code, _, err = run_cli(capsys, *base, "--replicas", "0")
    assert_one_line_error(code, err, "--replicas must be >= 1")
    code, _, err = run_cli(capsys, *base, "--replicas", "2", "--min-replicas", "3")
    assert_one_line_error(code, err, "--min-replicas in 0..--replicas")
