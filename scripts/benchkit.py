"""The plumbing the benchmark scripts share, each piece once: where things are (repository, GGUF pair, specrt
command, the llama.cpp build of scripts/build_llamacpp.sh), logging, interleaving (ABBA) orders, percentiles,
a timed forward, the mixed prompt set, exporting a bundle, loopback servers (start and wait for /health, stop,
llama-server's command line), HTTP and server-sent events, client threads, RSS of this process and of
children, and a run's result files and charts.

Scripts run as `python scripts/NAME.py` (scripts/ is then on sys.path) and `import benchkit as kit`. Only the
standard library is imported at the top; matplotlib is imported inside the function that needs it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECRT_CLI = ROOT / ".venv/bin/specrt"
GGUF = {
    "target": ROOT / "models/qwen2.5-coder-1.5b-instruct.gguf",
    "draft": ROOT / "models/qwen2.5-coder-0.5b-instruct.gguf",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def command_line() -> str:
    """How this run was started, for the report: `python scripts/NAME.py ARGS`."""
    return f"python scripts/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:])


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def interleave(items: Iterable, turn: int) -> list:
    """`items` in order on even turns, reversed on odd ones (ABBA), so that drift hits all of them alike."""
    items = list(items)
    return items if turn % 2 == 0 else items[::-1]


def timed_forward(session, context: int, width: int, keep: int) -> float:
    """Milliseconds of one forward of `width` new tokens after `context` tokens, on a session's first row."""
    session.kv.rows[0].reset()
    session.kv.rows[0].advance([0] * context)
    t0 = time.perf_counter()
    session.forward([0] * width, keep=keep)
    return 1000 * (time.perf_counter() - t0)


def mixed_prompts(n: int) -> list[tuple[str, bool, str]]:
    """n different prompts (text, chat, kind): code, prose and chat in turn."""
    code = [
        "def merge_sort(items):\n",
        "class LRUCache:\n    def __init__(self, capacity: int):\n",
        'def parse_csv(path):\n    """Read a CSV file into a list of dicts."""\n',
        "async def fetch_all(urls):\n",
        "def levenshtein(a: str, b: str) -> int:\n",
        "import numpy as np\n\ndef softmax(x):\n",
    ]
    prose = [
        "Once upon a time, in a small village by the sea, there lived",
        "The main causes of inflation in modern economies are",
        "A good code review should",
        "The history of the printing press begins",
        "When planning a long hike, the most important thing is",
        "Rivers shape the land around them by",
    ]
    chat = [
        "Write a Python function that checks whether a string is a palindrome.",
        "Explain what a hash table is and when to use one.",
        "How do I reverse a linked list in place?",
        "What is the difference between a process and a thread?",
        "Write a SQL query that finds the second highest salary.",
        "Explain big-O notation with an example.",
    ]
    kinds = [(t, False, "code") for t in code], [(t, False, "prose") for t in prose], [(t, True, "chat") for t in chat]
    mixed = [item for triple in zip(*kinds, strict=True) for item in triple]
    return [mixed[i % len(mixed)] for i in range(n)]


# ---------------------------------------------------------------- bundles and the llama.cpp build


def export_bundle(role: str, out: Path, flags: list[str], what: str | None = None) -> Path:
    """`specrt export` of the role's GGUF into `out` with `flags` (no validation, no profile), unless `out`
    already holds a bundle."""
    if not (out / "manifest.json").exists():
        log(f"exporting {what or out.name}")
        cmd = [str(SPECRT_CLI), "export", "--model", str(GGUF[role]), "--role", role, "--out", str(out), *flags]
        subprocess.run(cmd + ["--no-validate", "--no-profile", "--quiet", "--overwrite"], check=True)
    return out


def llamacpp_bin(build: bool = False) -> Path | None:
    """The folder holding llama-server & co., built once by scripts/build_llamacpp.sh into ~/.cache/specrt.
    build=False: None when it is not built (the script gets 30 s); build=True: built now if need be (about
    40 minutes), a failure raises."""
    cmd = ["bash", str(ROOT / "scripts/build_llamacpp.sh")]
    if build:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    else:
        try:
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)
        except (subprocess.SubprocessError, OSError):
            return None
    return Path(out.stdout.strip().splitlines()[-1])


def llama_server_cmd(bin_dir: Path, slots: int, draft_k: int = 0, extra: Iterable[str] = ()) -> list[str]:
    """llama-server on the GGUF target, every core, `slots` parallel slots (-np) of 4096 tokens each, no web
    UI or log, then `extra`; with the GGUF draft (draft-simple, up to draft_k tokens) when draft_k."""
    cmd = [str(bin_dir / "llama-server"), "-m", str(GGUF["target"]), "-t", str(os.cpu_count() or 1)]
    cmd += ["-np", str(slots), "-c", str(4096 * slots), "--no-webui", "--log-disable", *extra]
    if draft_k:
        cmd += ["-md", str(GGUF["draft"]), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_k)]
    return cmd


# ---------------------------------------------------------------- servers on loopback and their clients


def start_server(cmd: list[str], timeout: float = 600, poll: float = 1.0) -> tuple[subprocess.Popen, str]:
    """`cmd --host 127.0.0.1 --port <free port>` started (output discarded) and waited for until its /health
    answers 200 (a loading llama-server answers 503); returns the process and its URL. A server that exits
    or is not up within `timeout` seconds is killed and RuntimeError raised."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [*cmd, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"server did not come up: {' '.join(cmd)}")
        time.sleep(poll)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def post(url: str, body: dict, timeout: float, headers: dict | None = None):
    """POST `body` as JSON; the open response, for a `with` block (iterating it reads a stream's lines)."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    return urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), headers), timeout=timeout)


def sse_events(response) -> Iterator[dict]:
    """The JSON payloads of a server-sent-event stream's `data:` lines (`data: [DONE]` skipped)."""
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def run_clients(fn: Callable, jobs: Iterable, concurrency: int, deadline: float | None = None) -> tuple[list, float]:
    """`concurrency` client threads share `jobs`: each takes the next when its last one is done and keeps what
    fn(job) returns (None: nothing). Returns those results, in the order they finished, and the wall time.
    With `deadline` (a time.perf_counter() value), a thread still busy after it is not waited for (each is
    waited for at least 1 s)."""
    jobs, lock, results, end = iter(jobs), threading.Lock(), [], object()

    def client() -> None:
        while True:
            with lock:
                job = next(jobs, end)
            if job is end:
                return
            result = fn(job)
            if result is not None:
                with lock:
                    results.append(result)

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=None if deadline is None else max(1.0, deadline - time.perf_counter()))
    return results, time.perf_counter() - start


# ---------------------------------------------------------------- memory


def peak_rss_gib() -> float:
    """This process's peak RSS so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def wait_child(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for a child process to end: its exit code and its own peak RSS in GiB (os.wait4)."""
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 2**20


def rss_mib(pid: int) -> float:
    """A running process's RSS now (/proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------- result files and charts


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1))


def write_outputs(out: Path | None, name: str, md: str, data=None, chart: Callable[[Path], None] | None = None) -> None:
    """A run's result files: <out>/<name>.json (data, when given), <out>/<name>.md and, when `chart` is given,
    <out>/<name>.png drawn by chart(path); then the markdown printed (only that when `out` is None)."""
    if out is None:
        print(md)
        return
    out.mkdir(parents=True, exist_ok=True)
    if data is not None:
        write_json(out / f"{name}.json", data)
    (out / f"{name}.md").write_text(md)
    if chart is not None:
        chart(out / f"{name}.png")
    print(md)


def pyplot():
    """matplotlib.pyplot drawing to files only (Agg), or None when matplotlib is not installed (no chart)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def concurrency_axes(ax, ylabel: str, legend_size: int) -> None:
    """An axis of throughput against concurrent requests (log 2 scale)."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
