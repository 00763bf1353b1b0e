"""Export-time validation: the ONNX graph, run through the runtime's own session, against PyTorch.

The same token sequence (real text) goes through prefill, 1-token decode, several verify widths and a verify
after a rollback; each step's logits are compared with the transformers model run on the whole sequence.

Tolerance (unquantized graphs): max |logit difference| <= 1e-3 * max(1, max |reference logit|).
fp32 dot products of length K in a different summation order differ by about sqrt(K) * 2^-24 relative
(~6e-6 for K = 9000), and L residual layers add such errors up roughly linearly, so a correct graph lands
around 1e-5 relative for ~30 layers: the bound leaves two orders of magnitude of headroom. Real bugs (a
wrong RoPE table, a missing bias, a mis-wired norm, a stale KV slot) move logits by O(1) relative. A top-1
disagreement fails the check unless the reference's top-2 margin there is within 2x the tolerance
(a near-tie that legitimately flips). Quantized graphs record the same figures without gating.

fp16 graphs are compared with the PyTorch model cast to fp16 (the same weights, rounded the same way), and
their tolerance is measured rather than fixed: at each step, twice how far PyTorch's own fp16 model is from
its fp32 model (at least the fp32 bound). Two correct fp16 implementations round differently in every
layer, so they differ by about as much as either differs from fp32; a real bug moves logits by O(1) relative,
orders of magnitude more (the tiny test models: 1.4e-3 relative against 1.8e-3 for PyTorch's fp16 drift).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bundle.loading import Bundle
from ..bundle.manifest import PAD_LOGIT, Manifest, Validation, ValidationStep
from ..bundle.tokenizer import TOKENIZER_FILE
from ..errors import ValidationError
from ..runtime.session import ModelSession, SessionOptions
from .progress import Progress
from .source import Checkpoint

RELATIVE_TOLERANCE = 1e-3


def validation_plan(max_seq_len: int) -> list[tuple[str, int]]:
    """(step, tokens): prefill, decode, verify widths, a rollback, more verify; fits max_seq_len."""
    prefill = max(2, min(24, max_seq_len - 24))
    return [
        ("prefill", prefill),
        ("decode", 1),
        ("verify", 5),
        ("rollback", 3),
        ("verify", 4),
        ("decode", 1),
        ("verify", 8),
    ]


# Real text keeps the comparison in distribution (top-1 agreement on random ids is mostly near-ties);
# after a rollback the stream moves on, so stale KV slots are overwritten with different tokens.
SAMPLE_TEXT = (
    "def binary_search(items, target):\n"
    '    """Return the index of target in the sorted list items, or -1."""\n'
    "    lo, hi = 0, len(items) - 1\n"
    "    while lo <= hi:\n"
    "        mid = (lo + hi) // 2\n"
    "        if items[mid] == target:\n"
    "            return mid\n"
    "The committee met on Tuesday to review the budget, and after a long discussion it agreed to fund "
    "the new library wing, provided that construction begins before the end of the year."
)


def _validation_tokens(tokenizer_path: Path, vocab: int) -> list[int]:
    from tokenizers import Tokenizer

    ids = [i for i in Tokenizer.from_file(str(tokenizer_path)).encode(SAMPLE_TEXT).ids if i < vocab]
    # Tiny test vocabularies may not cover the text: top up with seeded random ids.
    return ids + np.random.default_rng(0).integers(0, vocab, size=128).tolist()


def validate(ckpt: Checkpoint, out_dir: Path, manifest: Manifest, gated: bool, progress: Progress) -> Validation:
    import gc

    import torch
    import transformers

    # Phase 1, the graph; phase 2, PyTorch. One model in memory at a time keeps peak RSS near the larger
    # of the two instead of their sum (the 1.5B fp32 pair would need ~16 GB together).
    session = ModelSession(Bundle(out_dir, manifest), SessionOptions())
    own = manifest.architecture.padded_from or manifest.architecture.vocab_size  # the checkpoint's rows
    stream = iter(_validation_tokens(out_dir / TOKENIZER_FILE, own))
    seq: list[int] = []
    runs: list[tuple[str, int, list[int], np.ndarray]] = []  # (label, past, sequence so far, logits)
    for name, n in validation_plan(manifest.max_seq_len):
        if name == "rollback":
            session.kv.rows[0].rollback(n)
            del seq[-n:]
            continue
        past = len(seq)
        seq += [next(stream) for _ in range(n)]
        label = f"{name}({n})" + ("" if name == "prefill" or past == 0 else f"@{past}")
        runs.append((label, past, list(seq), session.forward(seq[past:], keep=n).astype(np.float64)))
    del session
    gc.collect()

    with progress.stage("validating: loading the PyTorch reference"):
        model = ckpt.load_torch_model(quiet=not progress.enabled)

    def reference(model) -> list[np.ndarray]:
        with torch.no_grad():
            return [model(torch.tensor([seq])).logits[0, -len(got) :].double().numpy() for _, _, seq, got in runs]

    refs = reference(model)
    drift = [np.zeros(1)] * len(runs)  # how far PyTorch's model in the bundle's dtype is from its fp32 model
    if manifest.dtype != "fp32":
        model = model.to(torch.float16)  # in place: one copy of the weights in memory
        wide, refs = refs, reference(model)
        drift = [np.abs(a - b) for a, b in zip(refs, wide, strict=True)]
    steps: list[ValidationStep] = []
    failures: list[str] = []
    bounds: list[float] = []
    for (label, past, _, got), ref, moved in zip(runs, refs, drift, strict=True):
        if np.any(got[:, own:] != np.float32(PAD_LOGIT)):  # padding ids (--vocab-size) must stay at probability 0
            failures.append(f"{label}: a padding id's logit is not {PAD_LOGIT}")
        got = got[:, :own]
        n = len(got)
        diff = float(np.abs(got - ref).max())
        agree = got.argmax(-1) == ref.argmax(-1)
        steps.append(ValidationStep(label, past, n, diff, float(agree.mean())))
        scale = max(1.0, float(np.abs(ref).max()))
        tol = max(RELATIVE_TOLERANCE * scale, 2 * float(moved.max()))
        bounds.append(tol / scale)
        if gated:
            top2 = np.sort(ref, axis=-1)[:, -2:]
            margin = top2[:, 1] - top2[:, 0]
            if diff > tol:
                failures.append(f"{label}: max |diff| {diff:.3g} > tolerance {tol:.3g}")
            elif np.any(~agree & (margin > 2 * tol)):
                failures.append(f"{label}: top-1 differs where the reference margin exceeds {2 * tol:.3g}")
    result = Validation(
        reference=f"transformers {transformers.__version__} / torch {torch.__version__} {manifest.dtype}",
        steps=steps,
        max_abs_diff=max(s.max_abs_diff for s in steps),
        top1_agreement=sum(s.top1_agreement * s.new_tokens for s in steps) / sum(s.new_tokens for s in steps),
        tolerance=max(bounds) if gated else None,
        passed=not failures,
    )
    del model
    if failures:
        raise ValidationError(
            f"the exported graph disagrees with PyTorch ({'; '.join(failures[:2])}); no bundle written"
        )
    return result
