"""`specrt serve` with scripts/trace_batch_k.py's hooks on the batch cost; SIGUSR1 writes every batched round
traced so far to $TRACE_OUT (JSON lines).

    TRACE_OUT=/tmp/trace.jsonl python results/trust/serve-shape-ratio/traced_serve.py serve --target ... -k auto
"""

import json
import os
import signal
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[3] / "scripts")]

import trace_batch_k  # noqa: E402

from specrt.cli import main  # noqa: E402

log: list[dict] = []
trace_batch_k.install_trace(log)


def dump(*_) -> None:
    with open(os.environ["TRACE_OUT"], "w") as f:
        f.writelines(json.dumps(entry) + "\n" for entry in log)


signal.signal(signal.SIGUSR1, dump)
sys.argv = ["specrt", *sys.argv[1:]]
sys.exit(main())
