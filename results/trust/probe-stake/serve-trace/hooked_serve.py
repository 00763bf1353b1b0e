"""`specrt serve` with `CostModel.choose` hooked: one line per row-round to /tmp/serve-trace.log (the symbol as in
../ab.py, context, alone, missed, tokens left, a_1, the catch-up price). Started by drive.py."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "results/trust/probe-stake")]

import ab  # noqa: E402

from specrt.cli import main  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402

_choose = costmodel.CostModel.choose
out = open(f"/tmp/serve-trace-{os.getpid()}.log", "w")  # noqa: SIM115 - open for the server's life


def traced(self, k_cap, context, alone=True, missed=0, remaining=None):
    c = _choose(self, k_cap, context, alone, missed, remaining)
    sym = str(c.k) if c.why == "pays" else ab.SYMBOLS[c.why]
    cu = self.catch_up_ms(missed, context)
    out.write(f"{sym} ctx={context} alone={alone} missed={missed} rem={remaining} a1={self.acceptance.rate(0):.2f} ")
    out.write(f"cu={cu:.1f}\n")
    out.flush()
    return c


costmodel.CostModel.choose = traced
main(sys.argv[1:])
