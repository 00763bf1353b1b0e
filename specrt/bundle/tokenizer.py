"""Text <-> token ids for a bundle: encoding, streaming decoding, chat templates, the tokenizer hash.

Wraps the `tokenizers` library (the same Rust tokenizer transformers uses) and renders chat templates with
a sandboxed jinja2 environment set up as transformers sets it up. It knows nothing about models or decoding.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import BundleError, PromptError

TOKENIZER_FILE = "tokenizer.json"


def tokenizer_hash(path: str | Path) -> str:
    """SHA-256 of the id -> token mapping (added tokens included).

    This is what must match between a draft and a target: speculation exchanges token ids, never text,
    so two tokenizers that map every id to the same token are interchangeable for pairing even if their
    text pre-processing settings are spelled differently.
    """
    blob = json.dumps(sorted(id_tokens(path).items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def id_tokens(path: str | Path) -> dict[int, str]:
    """Every id the tokenizer can produce, added tokens included, and its token."""
    from tokenizers import Tokenizer as _HFTokenizer

    return {i: t for t, i in _HFTokenizer.from_file(str(path)).get_vocab(with_added_tokens=True).items()}


def first_difference(a: dict[int, str], b: dict[int, str]) -> tuple[int, str | None, str | None] | None:
    """The lowest id the two mappings disagree on (a token, or None where one lacks the id), or None."""
    for i in sorted(a.keys() | b.keys()):
        if a.get(i) != b.get(i):
            return i, a.get(i), b.get(i)
    return None


class Tokenizer:
    def __init__(
        self,
        path: str | Path,
        eos_token_ids: list[int],
        bos_token_id: int | None = None,
        chat_template: str | None = None,
    ):
        from tokenizers import Tokenizer as _HFTokenizer

        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust error is long; keep its first line
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise BundleError(f"{path}: cannot load tokenizer ({first}); re-export the bundle") from None
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self._tok.id_to_token(token_id)

    def stream_decoder(self, prompt_ids: list[int]) -> StreamDecoder:
        return StreamDecoder(self._tok, prompt_ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise PromptError("this bundle has no chat template; pass a plain prompt (drop --chat)")
        eos = self.token(self.eos_token_ids[0]) if self.eos_token_ids else None
        return _render(
            self.chat_template,
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token(self.bos_token_id) or "",
            eos_token=eos or "",
        )

    def encode_chat(self, user_text: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user_text}
        ]
        return self.encode_messages(messages)

    def encode_messages(self, messages: list[dict[str, Any]]) -> list[int]:
        # The rendered template already holds BOS and friends, as in transformers' apply_chat_template.
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)


class StreamDecoder:
    """Incremental detokenization: text appears as soon as it is valid UTF-8, never half a character."""

    def __init__(self, tok: Any, prompt_ids: list[int]):
        from tokenizers.decoders import DecodeStream

        # Seeding with the prompt keeps word boundaries right (SentencePiece-style leading spaces).
        self._tok = tok
        self._stream = DecodeStream(ids=list(prompt_ids[-8:]), skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return self._stream.step(self._tok, int(token_id)) or ""


def _render(template: str, **context: Any) -> str:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(**context)
    except TemplateError as e:
        raise PromptError(f"chat template failed: {e}") from None
