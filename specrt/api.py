"""The public entry point: `load` a target (and optionally a draft) bundle, then `generate`.

    engine = specrt.load(target="engines/qwen-1.5b", draft="engines/qwen-0.5b")
    gen = engine.generate("def fib(n):", specrt.GenerationOptions(max_new_tokens=64))
    for text in gen:
        print(text, end="", flush=True)
    print(gen.stats.summary())

An Engine owns one KV cache per model, so it runs one generation at a time; create one Engine per worker.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .bundle import check_pair, open_bundle
from .costmodel import CostModel, StepCost
from .drafters import ModelDrafter, NgramDrafter
from .errors import OptionsError, PromptError
from .generate import Generation
from .options import GenerationOptions
from .profile import WIDTHS, profile_for
from .session import ModelSession, SessionOptions
from .speculative import Speculator

PathLike = str | os.PathLike


class Engine:
    def __init__(
        self,
        target: PathLike,
        draft: PathLike | None = None,
        session_options: SessionOptions | None = None,
        draft_session_options: SessionOptions | None = None,
        ngram: bool = False,
        verify: bool = False,
    ):
        target_bundle = open_bundle(target, verify=verify)
        draft_bundle = open_bundle(draft, verify=verify) if draft is not None else None
        if draft_bundle is not None:
            check_pair(target_bundle, draft_bundle)  # before any weights are loaded
        self.tokenizer = target_bundle.load_tokenizer()
        session_options = session_options or SessionOptions()
        self.target = ModelSession(target_bundle, session_options)
        self.draft = ModelSession(draft_bundle, draft_session_options or session_options) if draft_bundle else None
        self.ngram = NgramDrafter() if ngram else None
        # Learned across generations, deliberately (a service's prompts resemble each other): acceptance per
        # drafter (as a light prior for the next prompt) and live step-cost scales. Built at the first auto-k
        # generation; a later, larger max_draft_tokens reads widths past the profile by extrapolation.
        self._costs: dict[str, CostModel] = {}
        # Held by the generation that is running: the caches hold one sequence, so a second generation
        # interleaved with it would silently corrupt the first (EngineBusyError instead).
        self._turn = threading.Lock()

    def _cost_models(self, options: GenerationOptions, context: int) -> dict[str, CostModel]:
        """Cost models for auto k, from each bundle's cost profile (measured now if this machine has none)."""
        if options.num_draft_tokens is not None:
            return {}
        if not self._costs:
            target = StepCost(profile_for(self.target, options.max_draft_tokens + 1, context))
            if self.draft is not None:
                # Widths past 1 price the draft's catch-ups after rounds it sat out.
                draft = StepCost(profile_for(self.draft, max(WIDTHS), context))
                self._costs["model"] = CostModel(target, draft)
            if self.ngram is not None:
                self._costs["ngram"] = CostModel(target, None)  # the same target StepCost: one live scale
        return self._costs

    def reset(self) -> None:
        """Forget the cached context (the next prompt is prefilled from scratch)."""
        self.target.kv.reset()
        if self.draft is not None:
            self.draft.kv.reset()

    @property
    def max_seq_len(self) -> int:
        return self.target.max_len

    def encode(self, prompt: str, chat: bool = False, system: str | None = None) -> list[int]:
        if not isinstance(prompt, str):
            raise PromptError(f"prompt must be text, got {type(prompt).__name__}")
        if system is not None and not chat:
            raise OptionsError("a system message needs chat=True (it goes through the chat template)")
        for what, text in (("prompt", prompt), ("system message", system)):
            _check_text(what, text)
        return self.tokenizer.encode_chat(prompt, system) if chat else self.tokenizer.encode(prompt)

    def token_ids(self, prompt: Sequence[int]) -> list[int]:
        """A prompt given as token ids: integers (Python or numpy) inside the target's vocabulary."""
        if isinstance(prompt, (bytes, bytearray, memoryview)) or not isinstance(prompt, Sequence):
            raise PromptError(f"a prompt must be text or a list of token ids, got {type(prompt).__name__}")
        vocab = self.target.vocab_size
        ids = []
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise PromptError(f"prompt token {i} is {t!r}, not an integer token id")
            if not 0 <= t < vocab:
                raise PromptError(f"prompt token id {t} (position {i}) is outside the vocabulary [0, {vocab})")
            ids.append(int(t))
        return ids

    def generate(
        self,
        prompt: str | Sequence[int],
        options: GenerationOptions | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
    ) -> Generation:
        """Start a streaming generation; iterate it for text. With options.num_draft_tokens == 0, or no
        draft loaded, this is plain target-only decoding through the same loop."""
        options = GenerationOptions() if options is None else options
        if not isinstance(options, GenerationOptions):
            raise OptionsError(f"options must be a specrt.GenerationOptions, got {type(options).__name__}")
        if isinstance(prompt, str):
            ids = self.encode(prompt, chat, system)
        elif chat or system is not None:
            raise OptionsError("chat=True and system need a text prompt, not token ids")
        else:
            ids = self.token_ids(prompt)
        drafters: list[ModelDrafter | NgramDrafter] = []
        if options.num_draft_tokens != 0:
            drafters += [self.ngram] if self.ngram is not None else []
            drafters += [ModelDrafter(self.draft)] if self.draft is not None else []
        costs = self._cost_models(options, len(ids)) if drafters else {}
        for cost in costs.values():
            cost.start_generation()
        return Generation(Speculator(self.target, drafters, options, costs), self.tokenizer, ids, self._turn)

    def complete(self, prompt: str | Sequence[int], options: GenerationOptions | None = None, **kw) -> Generation:
        """Run a generation to the end and return it (text, token_ids, stats, finish_reason)."""
        return self.generate(prompt, options, **kw).consume()


def _check_text(what: str, text: str | None) -> None:
    """Text must be valid Unicode: a lone surrogate (say, from undecodable command-line bytes) has no UTF-8 form."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PromptError(
            f"the {what} is not valid Unicode text: lone surrogate U+{ord(text[e.start]):04X} at character "
            f"{e.start}; pass UTF-8 text"
        ) from None


def load(
    target: PathLike,
    draft: PathLike | None = None,
    *,
    threads: int = 0,
    device: str = "cpu",
    draft_threads: int | None = None,
    spinning: bool = True,
    ngram: bool = False,
    verify: bool = False,
) -> Engine:
    """Load bundles for generation. threads=0 lets ONNX Runtime choose; ngram=True adds prompt-lookup
    drafting (alone, or beside the draft model: with auto k the one promising more tokens/s drafts each round).
    Every load checks each bundle file's size and the small files' SHA-256 against the manifest; verify=True
    hashes the weights too (seconds per GB).

    spinning=True lets ONNX Runtime's worker threads spin while a run waits for work (they sleep otherwise,
    and waking them costs at every parallel section). With a draft loaded they stop spinning as soon as a
    run returns: the two sessions take turns on the same cores, and threads still spinning after one's run
    steal the cores from the other's (scripts/bench_spinning.py, 2 cores, int4 1.5B + int4 0.5B: a 2-token
    verify takes 62 ms spinning during runs, 67 ms without spinning, 96 ms spinning throughout).
    """
    opts = SessionOptions(
        device=device, intra_op_threads=threads, allow_spinning=spinning, spin_between_runs=draft is None
    )
    draft_opts = replace(opts, intra_op_threads=threads if draft_threads is None else draft_threads)
    return Engine(target, draft, opts, draft_opts, ngram=ngram, verify=verify)
