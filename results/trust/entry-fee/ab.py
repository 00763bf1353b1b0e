"""In-process A/B, int4 pair at one stream, short requests one after another through one engine each (as a
server sees them): the output a request decodes alone before its first drafting round weighed as missed
tokens ("old", the scheduler's `_missed` before the entry-fee change, patched into that engine's scheduler)
or left out as entry fee like the prompt ("new", the code as it is). The loop, prompts and trace are
probe-stake's (results/trust/probe-stake/ab.py: ABBA per prompt, a character per round).

    python results/trust/entry-fee/ab.py 3 64 > ab.log                # repeats, max new tokens
    python results/trust/entry-fee/ab.py 2 128 peers > ab-peers.log   # bench_peers' 8 prompts, EOS ignored
"""

import importlib.util
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("probe_stake_ab", HERE.parent / "probe-stake" / "ab.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)  # puts the repository on sys.path

import specrt  # noqa: E402


def weighed_missed(self, r) -> int:
    """The scheduler's `_missed` before the change: every output token the draft lacks, past the prompt."""
    if self._behind(r) <= 2:
        return 0
    return max(0, len(r.tokens) - 1 - max(self.runner.draft.kv.rows[r.slot].length, len(r.prompt)))


def load(old: bool):
    engine = specrt.load(ab.ROOT / "engines/qwen2.5-coder-1.5b-int4", ab.ROOT / "engines/qwen2.5-coder-0.5b-int4")
    if old:
        engine.scheduler._missed = types.MethodType(weighed_missed, engine.scheduler)
    return engine


if __name__ == "__main__":
    which = sys.argv[3] if len(sys.argv) > 3 else "code"
    ab.run({"old": load(True), "new": load(False)}, int(sys.argv[1]), int(sys.argv[2]), which)
