"""Per pass shape (slots computed, width, kind of round) of a traced server's last N batched rounds: rounds,
measured and predicted ms, the plain round's predicted ms, tokens per round; then the ratios in force at the end.

    python results/trust/serve-shape-ratio/summarise.py TRACE.jsonl [N]
"""

import json
import statistics
import sys
from collections import defaultdict

rounds = [json.loads(line) for line in open(sys.argv[1])]
rounds = [r for r in rounds if "measured_ms" in r]
last = int(sys.argv[2]) if len(sys.argv) > 2 else len(rounds)
groups = defaultdict(list)
for r in rounds[-last:]:
    groups[(max(r["rows"], r["span"] or 0), max(r["drafted"]) + 1, r["kind"])].append(r)
print("slots width kind rounds measured_ms predicted_ms plain_predicted_ms tokens/round")
for (slots, width, kind), rs in sorted(groups.items()):
    tokens = statistics.mean(sum(r["accepted"]) + len(r["accepted"]) for r in rs)
    measured = statistics.median(r["measured_ms"] for r in rs)
    predicted = statistics.median(r["chosen_ms"] for r in rs)
    plain = statistics.median(r["plain_ms"] for r in rs)
    print(f"{slots:5} {width:5} {kind:7} {len(rs):6} {measured:11.1f} {predicted:12.1f} {plain:18.1f} {tokens:12.2f}")
print("ratios at the end:", rounds[-1]["ratios"])
