"""`specrt serve`: a real server on a loopback port over tiny bundles, spoken to with the official openai
client and with raw HTTP for what a client should never be able to do."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import import_or_skip

import_or_skip("starlette")
openai = import_or_skip("openai")

import specrt  # noqa: E402
from specrt import GenerationOptions  # noqa: E402
from specrt.serve.protocol import Defaults  # noqa: E402
from specrt.serve.server import ServeConfig, create_app  # noqa: E402

MODEL = "tiny"


class Running:
    """A uvicorn server on 127.0.0.1 in a thread, stopped at the end."""

    def __init__(self, engine, **config):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config.setdefault("defaults", Defaults(max_tokens=16, temperature=0.0))
        self.app = create_app(engine, ServeConfig(MODEL, **config))
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key: str = "none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def post(url: str, body, headers: dict | None = None, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def engine(zoo):
    return specrt.load(zoo.target(), zoo.noisy_draft(), max_batch=4)


@pytest.fixture(scope="module")
def server(engine):
    s = Running(engine)
    yield s
    s.stop()


def greedy(engine, prompt: str, n: int, chat: bool = False) -> specrt.Generation:
    return engine.complete(prompt, GenerationOptions(max_new_tokens=n, ignore_eos=True), chat=chat)


def test_completions_and_chat_equal_the_engine(server, engine):
    client = server.client()
    expected = greedy(engine, "def fibonacci(n):", 12)
    out = client.completions.create(
        model=MODEL, prompt="def fibonacci(n):", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 12 and out.usage.prompt_tokens == len(expected.prompt_ids)
    pieces = client.completions.create(
        model=MODEL,
        prompt="def fibonacci(n):",
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(pieces)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    chat = greedy(engine, "hello there", 10, chat=True)
    messages = [{"role": "user", "content": "hello there"}]
    out = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].message.content == chat.text and out.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    deltas = list(stream)
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == chat.text
    assert deltas[-1].choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_sixteen_concurrent_requests_each_equal_their_own(server, engine):
    prompts = [f"def f{i}(x):" + " y" * (i % 5) for i in range(16)]
    expected = {p: greedy(engine, p, 6 + i % 7).text for i, p in enumerate(prompts)}
    client = server.client()
    status, before = get(server.url + "/metrics")

    def ask(i: int):
        p = prompts[i]
        return p, client.completions.create(
            model=MODEL, prompt=p, max_tokens=6 + i % 7, temperature=0, extra_body={"ignore_eos": True}
        )

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, range(16)))
    for p, out in results:
        assert out.choices[0].text == expected[p], p
    generated = sum(out.usage.completion_tokens for _, out in results)
    assert generated == sum(6 + i % 7 for i in range(16))
    families = metrics(server)
    assert (
        families["specrt:generation_tokens"]["specrt:generation_tokens_total"]
        - counter(before, "specrt:generation_tokens_total")
        == generated
    )


def metrics(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(server.url + "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {
            s.name + ("" if not s.labels else json.dumps(s.labels, sort_keys=True)): s.value for s in family.samples
        }
    return out


def counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_metrics_count_what_happened(server):
    client = server.client()
    before = metrics(server)
    for _ in range(3):
        client.completions.create(
            model=MODEL,
            prompt="class A:",
            max_tokens=5,
            temperature=0,
            extra_body={"ignore_eos": True, "num_draft_tokens": 2},
        )
    after = metrics(server)

    def delta(family, sample):
        return after[family].get(sample, 0) - before.get(family, {}).get(sample, 0)

    assert delta("specrt:requests", 'specrt:requests_total{"outcome": "max_new_tokens"}') == 3
    assert delta("specrt:generation_tokens", "specrt:generation_tokens_total") == 15
    assert delta("specrt:spec_decode_num_draft_tokens", "specrt:spec_decode_num_draft_tokens_total") > 0
    assert delta("specrt:e2e_request_latency_seconds", "specrt:e2e_request_latency_seconds_count") == 3
    assert after["specrt:num_requests_running"]["specrt:num_requests_running"] == 0
    # Only ids came back: 3 requests x (prefill + 2-3 rounds), a few dozen bytes each, never a logits row.
    to_host = delta("specrt:transfer_bytes", 'specrt:transfer_bytes_total{"direction": "to_host"}')
    assert 0 < to_host < 3 * 4 * 200, to_host
    assert delta("specrt:transfer_bytes", 'specrt:transfer_bytes_total{"direction": "to_device"}') > 0
    assert any(
        k.startswith("specrt:spec_decode_num_accepted_tokens_per_pos_total")
        for k in after["specrt:spec_decode_num_accepted_tokens_per_pos"]
    )


def test_a_repeated_prompt_is_served_from_the_kv_cache_and_counted(server):
    """A prompt a free slot already holds is not prefilled again: usage says how much was cached (OpenAI's
    prompt_tokens_details.cached_tokens) and the prefix-cache counters add it up."""
    client = server.client()
    prompt = "def cached_prefix_example(a, b, c):\n    return"
    before = metrics(server)
    first = ask_once(client, prompt)
    second = ask_once(client, prompt)
    after = metrics(server)
    n = first.usage.prompt_tokens
    assert second.usage.prompt_tokens == n and second.choices[0].text == first.choices[0].text
    assert second.usage.prompt_tokens_details.cached_tokens == n - 1  # all but the token fed for the logits
    hits = "specrt:prefix_cache_hits_total"
    queries = "specrt:prefix_cache_queries_total"
    assert after["specrt:prefix_cache_queries"][queries] - before["specrt:prefix_cache_queries"][queries] == 2 * n
    got = after["specrt:prefix_cache_hits"][hits] - before["specrt:prefix_cache_hits"][hits]
    assert got == first.usage.prompt_tokens_details.cached_tokens + n - 1


def ask_once(client, prompt: str):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)


@pytest.mark.parametrize(
    "path,body,status,param",
    [
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 3}, 400, "logprobs"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [10**9]}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": [1, 2]}, 400, "stop"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "num_draft_tokens": "many"}, 400, "num_draft_tokens"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "messages[0].role",
        ),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
        # JSON can carry a lone surrogate ("\ud800"); it has no UTF-8 form, in a prompt or in a message
        ("/v1/completions", {"model": MODEL, "prompt": "a\ud800b"}, 400, "prompt"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "a\ud800"}]},
            400,
            "messages",
        ),
        ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
        ("/v1/completions", [1, 2, 3], 400, None),
    ],
)
def test_bad_requests_get_an_openai_error(server, path, body, status, param):
    code, reply = post(server.url + path, body)
    assert code == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"} and reply["error"]["param"] == param
    assert "Traceback" not in reply["error"]["message"]


def test_prompt_too_long_malformed_json_huge_body_unknown_path(server):
    code, reply = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "x " * 400})
    assert code == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert "the prompt has" in reply["error"]["message"] and "at most 256" in reply["error"]["message"]
    code, reply = post(server.url + "/v1/completions", None, raw=b'{"model": "tiny", "prompt": ')
    assert code == 400 and "not valid JSON" in reply["error"]["message"]
    code, reply = post(server.url + "/v1/completions", None, raw=b"[" * 200_000)
    assert code == 400
    # A body announced as 5 MB: refused before it is read (a raw socket, since a client that insists on
    # sending all of it first sees the connection closed under it).
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {5 << 20}\r\n\r\n"
        sock.sendall(head.encode() + b" " * 1000)
        answer = b""
        while b"body_too_large" not in answer and (part := sock.recv(65536)):
            answer += part
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "body_too_large" in answer
    code, text = get(server.url + "/v1/nothing")
    assert code == 404 and json.loads(text)["error"]["type"] == "not_found_error"
    code, text = get(server.url + "/health")
    assert code == 200 and json.loads(text)["status"] == "ok"


def test_api_key(engine):
    s = Running(engine, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").completions.create(model=MODEL, prompt="x", max_tokens=2)
        code, reply = post(s.url + "/v1/completions", {"model": MODEL, "prompt": "x"})
        assert code == 401 and reply["error"]["type"] == "authentication_error"
        out = s.client("s3cret").completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert out.usage.completion_tokens <= 2
    finally:
        s.stop()


def test_full_queue_gets_429_and_a_disconnect_frees_the_slot(zoo):
    engine = specrt.load(zoo.target(), max_batch=1)
    s = Running(engine, max_queue=0, defaults=Defaults(max_tokens=200, temperature=0.0))
    try:
        body = {"model": MODEL, "prompt": "def f(x):", "stream": True, "ignore_eos": True}
        req = urllib.request.Request(
            s.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        stream = urllib.request.urlopen(req, timeout=60)
        assert stream.readline().startswith(b"data: ")  # the one slot is taken
        code, reply = post(s.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert code == 429 and reply["error"]["type"] == "rate_limit_error"
        stream.close()  # the client goes away mid-stream
        deadline = time.time() + 10
        while metrics(s)["specrt:num_requests_running"]["specrt:num_requests_running"] and time.time() < deadline:
            time.sleep(0.05)
        assert metrics(s)["specrt:num_requests_running"]["specrt:num_requests_running"] == 0
        t0 = time.time()
        code, reply = post(
            s.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, "ignore_eos": True}
        )
        assert code == 200 and reply["usage"]["completion_tokens"] == 3 and time.time() - t0 < 5
    finally:
        s.stop()


def test_draining_server_answers_503(engine):
    s = Running(engine)
    try:
        s.app.state.server.draining = True
        code, reply = post(s.url + "/v1/completions", {"model": MODEL, "prompt": "x"})
        assert code == 503 and reply["error"]["type"] == "unavailable_error"
        assert get(s.url + "/health")[0] == 503
    finally:
        s.stop()


def test_health_while_loading(engine):
    gate = threading.Event()

    def slow_loader():
        gate.wait(30)
        return engine

    s = Running(slow_loader)
    try:
        code, text = get(s.url + "/health")
        assert code == 503 and "loading" in json.loads(text)["error"]["message"]
        code, reply = post(s.url + "/v1/completions", {"model": MODEL, "prompt": "x"})
        assert code == 503
        gate.set()
        deadline = time.time() + 10
        while get(s.url + "/health")[0] != 200 and time.time() < deadline:
            time.sleep(0.05)
        assert get(s.url + "/health")[0] == 200
    finally:
        s.stop()


def test_specrt_serve_starts_answers_and_stops_on_sigterm(zoo, tmp_path):
    """The command itself: health turns 200 once the models are loaded; SIGTERM while a request streams
    lets it finish (within the drain time) and the process exits cleanly."""
    import os
    import signal
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "specrt", "serve", "--target", str(zoo.target()), "--port", str(port)]
    cmd += ["--model-name", MODEL, "--max-batch", "2", "--drain-seconds", "20"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if get(url + "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        body = {
            "model": MODEL,
            "prompt": "def f(x):",
            "max_tokens": 40,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        }
        req = urllib.request.Request(
            url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        stream = urllib.request.urlopen(req, timeout=60)
        assert stream.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        rest = stream.read().decode()
        assert rest.rstrip().endswith("data: [DONE]")  # the running request finished
        # uvicorn re-raises the signal once it has shut down: the conventional exit status of SIGTERM.
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_specrt_serve_bad_flags_are_one_line(capsys, zoo):
    from test_errors import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "serve", "--target", zoo.target(), "--temperature", "-1")
    assert_one_line_error(code, err, "temperature must be a finite number >= 0")
    code, _, err = run_cli(capsys, "serve", "--target", zoo.target(), "--max-batch", "0")
    assert_one_line_error(code, err, "--max-batch must be >= 1")


def test_the_readme_serving_examples_run(server):
    """The curl and openai examples of the README's serving section, as written there, with only the port
    and the model name swapped for this server's."""
    import re
    import shutil
    import subprocess
    from contextlib import redirect_stdout
    from io import StringIO
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("## Serving", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    curl = next(code for lang, code in blocks if lang == "bash" and code.startswith("curl"))
    python = next(code for lang, code in blocks if lang == "python")

    def local(code: str) -> str:
        return code.replace(":8000", f":{server.port}").replace('"qwen"', f'"{MODEL}"')

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the README's curl example cannot run (apt-get install curl)")
    out = subprocess.run(local(curl), shell=True, capture_output=True, text=True, timeout=60, check=True)
    reply = json.loads(out.stdout)
    assert reply["object"] == "text_completion" and reply["choices"][0]["text"]
    assert reply["usage"]["completion_tokens"] > 0
    printed = StringIO()
    with redirect_stdout(printed):
        exec(compile(local(python), "README.md (serving)", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert len(lines) >= 3 and "completion_tokens" in printed.getvalue()
