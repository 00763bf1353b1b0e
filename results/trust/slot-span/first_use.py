#!/usr/bin/env python
"""A 16-slot engine of one bundle: 16 sequential requests (each takes the never-used slot), twice; each one's
prefill milliseconds by slot, and the growth of the process's resident memory. A slot's first run writes its
whole KV row, and the memory is mapped then (np.zeros leaves the pages to the first write).

    python results/trust/slot-span/first_use.py [BUNDLE-NAME]
"""

import sys
from pathlib import Path

import specrt
from specrt import GenerationOptions

ROOT = Path(__file__).resolve().parents[3]
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-native"
engine = specrt.load(ROOT / "engines" / name, max_batch=16)
kv = engine.target.kv
print(f"KV buffers: {kv.nbytes / 2**30:.2f} GiB ({kv.shape} x {2 * len(kv.layers)})")
options = GenerationOptions(max_new_tokens=2, ignore_eos=True, num_draft_tokens=0)


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


for rep in range(2):
    out, before = [], resident_mib()
    for i in range(16):
        g = engine.generate(f"def f{i}_{rep}(x): return", options)
        g.consume()
        out.append(f"{g._request.slot}:{1000 * g.stats.prefill_s:.0f}")
    label = "first use" if rep == 0 else "again"
    print(f"{label}: slot:prefill ms {' '.join(out)}; resident +{resident_mib() - before:.0f} MiB")
