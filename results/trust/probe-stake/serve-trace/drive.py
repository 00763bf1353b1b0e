"""A hooked `specrt serve` (int4 pair, auto k, --max-batch 1, as the suite's one-stream run) given the serve
suite's 8 code prompts together, then one at a time; each request's speculative usage and tokens/s to stdout,
the server's row-rounds in /tmp/serve-trace.log (one request per run of falling `rem`).

    python results/trust/probe-stake/serve-trace/drive.py
"""

import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "scripts"))

import benchkit as kit  # noqa: E402
import load_test as lt  # noqa: E402

ENGINES = ROOT / "engines"
cmd = [sys.executable, str(Path(__file__).with_name("hooked_serve.py")), "serve", "--max-batch", "1"]
cmd += ["--target", str(ENGINES / "qwen2.5-coder-1.5b-int4"), "--draft", str(ENGINES / "qwen2.5-coder-0.5b-int4")]
cmd += ["--model-name", "m", "--max-queue", "1000", "-k", "auto"]
prompts = [json.loads(line)["prompt"] for line in (ROOT / "results/trust/serve-code-c1/prompts.jsonl").open()]
proc, url = kit.start_server(cmd)
try:
    burst = [threading.Thread(target=lt.one, args=(url, "m", p, 64, i, 0.0, None)) for i, p in enumerate(prompts)]
    for t in burst:
        t.start()
    for t in burst:
        t.join()
    for i, p in enumerate(prompts):
        r = lt.one(url, "m", p, 64, i, 0.0, None)
        print(i, r.get("speculative"), round(r["tokens"] / r["s"], 1), flush=True)
finally:
    kit.stop_server(proc)
