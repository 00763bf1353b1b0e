#!/usr/bin/env python
"""Make a tiny random target/draft pair of Hugging Face checkpoints that share a tokenizer.

    python scripts/make_tiny_pair.py models/

writes models/tiny-target (qwen2, 4 layers) and models/tiny-draft (the target plus a little noise, so
it agrees with the target most of the time, as a real draft would). The text they write is gibberish:
they exist to try the export -> generate flow in seconds without downloading anything.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=Path("models"))
    args = parser.parse_args()

    from transformers.utils import logging

    from specrt.export.tiny import make_checkpoint, make_tokenizer

    logging.disable_progress_bar()
    tokenizer = make_tokenizer(args.out / "tiny-tokenizer")
    target = make_checkpoint(
        args.out / "tiny-target",
        tokenizer,
        "qwen2",
        layers=4,
        hidden=128,
        heads=4,
        kv_heads=2,
        intermediate=256,
    )
    draft = make_checkpoint(args.out / "tiny-draft", tokenizer, noise_from=target, noise=0.05, seed=1)
    print(f"wrote {target} and {draft}")


if __name__ == "__main__":
    main()
