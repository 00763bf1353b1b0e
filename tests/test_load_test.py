"""scripts/load_test.py's suite stops at a server that dies under it (the kernel's out-of-memory killer took one
of three native servers at 16 KV slots each): the levels measured before stand, the report says where and why it
stopped, and the run exits 1, instead of reporting a dead server's failures as 0 tokens/s and going on."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(scope="module")
def load_test():
    sys.path.insert(0, str(SCRIPTS))  # it imports benchkit beside it
    try:
        spec = importlib.util.spec_from_file_location("load_test", SCRIPTS / "load_test.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPTS))


def _process(killed: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    if killed:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return proc


def test_a_server_that_dies_under_its_requests_stops_the_level(load_test, monkeypatch):
    alive, dead = _process(killed=False), _process(killed=True)
    ran = []

    def run_requests(args, c, n, first):  # the requests themselves: not what this tests
        ran.append(args.url)
        return [{"ok": False, "error": "connection refused"}] * n, 0.1

    monkeypatch.setattr(load_test, "run_requests", run_requests)
    args = SimpleNamespace(rounds=2, requests=4, url=None)
    try:
        assert load_test.died("k=0", alive) is None
        expected = r"auto \(pid \d+\) exited with code -9 \(SIGKILL: most likely out of memory"
        with pytest.raises(load_test.ServerDied, match=expected):
            load_test.alternate(args, {"k=0": (alive, "http://a"), "auto": (dead, "http://b")}, 2)
        assert ran == ["http://a", "http://b"]  # stopped after the dead server's first part, not at the level's end
        done = load_test.alternate(args, {"k=0": (alive, "http://a")}, 2)
        assert [len(done["k=0"][0])] == [4]
    finally:
        alive.kill()
        alive.wait(timeout=30)


def test_the_report_says_where_the_suite_stopped(load_test):
    row = {
        "requests": 4,
        "failures": 0,
        "requests_per_s": 1.0,
        "output_tokens_per_s": 64.0,
        "ttft_p50": 0.1,
        "ttft_p99": 0.2,
        "tpot_p50": 0.05,
        "tpot_p99": 0.06,
        "itl_p50": 0.05,
        "itl_p99": 0.06,
        "acceptance": None,
    }
    rows = [
        {"config": "specrt auto k", "concurrency": 1} | row,
        {"config": "specrt k=0", "concurrency": 1} | row,
        {"config": "stopped", "concurrency": 2, "error": "specrt auto k (pid 7) exited with code -9"},
    ]
    md = load_test.report(rows, "cmd")
    assert "auto / best of k=0" in md
    assert "**Stopped at concurrency 2**: specrt auto k (pid 7) exited with code -9; later levels not run" in md
    assert "| stopped |" not in md  # no table row for it
