"""The serve suite's sequence against servers already running: 8 requests together on each (a cold start),
then each level's requests (max(4c, 24), 4 parts) with the servers alternating part by part.

    python results/trust/serve-shape-ratio/drive.py auto=http://127.0.0.1:8101,k0=http://127.0.0.1:8102 2,4,8
"""

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[3] / "scripts")]

import load_test  # noqa: E402

urls = dict(u.split("=", 1) for u in sys.argv[1].split(","))
levels = [int(c) for c in sys.argv[2].split(",")]
args = argparse.Namespace(
    url=None, model="qwen", api_key=None, prompts=None, max_tokens=64, temperature=0.0, seed=0, requests=24, rounds=4
)
for name, url in urls.items():
    args.url, t0 = url, time.time()
    load_test.run_level(args, 8, 8)
    print(name, "cold burst", round(time.time() - t0, 1), "s", flush=True)
for c in levels:
    done = load_test.alternate(args, urls, c)
    speeds = {name: load_test.summarize(*done[name])["output_tokens_per_s"] for name in urls}
    ratio = speeds["auto"] / speeds["k0"]
    print(c, {n: round(v, 1) for n, v in speeds.items()}, "auto/k0", round(ratio, 3), time.strftime("%X"), flush=True)
