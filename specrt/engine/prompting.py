"""Prompts into checked token ids: text through the bundle's tokenizer (or its chat template), token ids
checked against the vocabulary, and the length against the target's max_seq_len. The engine checks every
prompt here before it reaches the scheduler; a front end that forwards prompts to engines elsewhere (the
Ray Serve application) checks them here too, with the same one-line errors, before sending them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..bundle.tokenizer import Tokenizer
from ..errors import OptionsError, PromptError


class Prompts:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_seq_len: int, where: object):
        self.tokenizer, self.vocab_size, self.max_seq_len, self.where = tokenizer, vocab_size, max_seq_len, where

    @classmethod
    def of_bundle(cls, bundle) -> Prompts:
        """From a bundle's tokenizer and manifest alone (no model loaded)."""
        m = bundle.manifest
        return cls(bundle.load_tokenizer(), m.architecture.vocab_size, m.max_seq_len, bundle.path)

    def encode(self, prompt: str, chat: bool = False, system: str | None = None) -> list[int]:
        if not isinstance(prompt, str):
            raise PromptError(f"prompt must be text, got {type(prompt).__name__}")
        if system is not None and not chat:
            raise OptionsError("a system message needs chat=True (it goes through the chat template)")
        for what, text in (("prompt", prompt), ("system message", system)):
            _check_text(what, text)
        return self.tokenizer.encode_chat(prompt, system) if chat else self.tokenizer.encode(prompt)

    def encode_messages(self, messages: Sequence[dict]) -> list[int]:
        """A conversation ({"role", "content"} dicts) through the bundle's chat template."""
        for i, m in enumerate(messages):
            _check_text(f"message {i}", m.get("content"))
        return self.tokenizer.encode_messages(list(messages))

    def token_ids(self, prompt: Sequence[int]) -> list[int]:
        """A prompt given as token ids: integers (Python or numpy) inside the target's vocabulary."""
        if isinstance(prompt, (bytes, bytearray, memoryview)) or not isinstance(prompt, Sequence):
            raise PromptError(f"a prompt must be text or a list of token ids, got {type(prompt).__name__}")
        vocab = self.vocab_size
        ids = []
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise PromptError(f"prompt token {i} is {t!r}, not an integer token id")
            if not 0 <= t < vocab:
                raise PromptError(f"prompt token id {t} (position {i}) is outside the vocabulary [0, {vocab})")
            ids.append(int(t))
        return ids

    def ids(self, prompt: str | Sequence[int], chat: bool = False, system: str | None = None) -> list[int]:
        """The ids a generation starts from: not empty, and leaving room to generate."""
        if isinstance(prompt, str):
            ids = self.encode(prompt, chat, system)
        elif chat or system is not None:
            raise OptionsError("chat=True and system need a text prompt, not token ids")
        else:
            ids = self.token_ids(prompt)
        if not ids:
            raise PromptError("the prompt is empty; give at least one token of text")
        if len(ids) >= self.max_seq_len:
            raise PromptError(
                f"the prompt has {len(ids)} tokens but {self.where} holds at most {self.max_seq_len} "
                "(max_seq_len), leaving no room to generate; shorten the prompt or re-export with a larger "
                "--max-seq-len"
            )
        return ids


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
