"""Plain, k = 3 and auto, interleaved per prompt, on the Gemma 3 270M pair (see README.md here)."""

import sys
import time

import specrt
from specrt import GenerationOptions

target, draft = sys.argv[1:3] if len(sys.argv) > 2 else ("engines/gemma-3-270m-fp32", "engines/gemma-3-270m-int4")
engine = specrt.load(target, draft)
engine.complete("warm up", GenerationOptions(max_new_tokens=8))
tokens = {"plain": 0, "k3": 0, "auto": 0}
seconds = dict.fromkeys(tokens, 0.0)
accepted = drafted = 0
for _ in range(2):
    for prompt in ["def fibonacci(n):", "The capital of France is", "Once upon a time,"]:
        for name, k in (("plain", 0), ("k3", 3), ("auto", None)):
            start = time.perf_counter()
            out = engine.complete(prompt, GenerationOptions(max_new_tokens=64, num_draft_tokens=k, ignore_eos=True))
            seconds[name] += time.perf_counter() - start
            tokens[name] += len(out.token_ids)
            if name == "k3":
                accepted, drafted = accepted + out.stats.accepted, drafted + out.stats.drafted
for name in tokens:
    print(name, f"{tokens[name] / seconds[name]:.1f} tok/s")
print("k = 3 acceptance", accepted / drafted)
