"""A bundle folder on disk: its manifest, the files the manifest names, and its tokenizer.

`open_bundle` checks that the folder is a finished bundle (manifest readable, graph and tokenizer files
present) before anything heavy is loaded, and `check_pair` decides whether a draft may serve a target.
Loading the graph into ONNX Runtime is the session module's job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import BundleError, IncompatibleModelsError
from .manifest import Manifest
from .tokenizer import TOKENIZER_FILE, Tokenizer


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: Manifest

    @property
    def model_path(self) -> Path:
        return self.path / self.manifest.graph.model_file

    @property
    def name(self) -> str:
        return self.manifest.name

    def load_tokenizer(self) -> Tokenizer:
        spec = self.manifest.tokenizer
        template = None
        if spec.chat_template:
            template = (self.path / spec.chat_template).read_text(encoding="utf-8")
        return Tokenizer(
            self.path / TOKENIZER_FILE,
            eos_token_ids=spec.eos_token_ids,
            bos_token_id=spec.bos_token_id,
            chat_template=template,
        )


def open_bundle(path: str | os.PathLike) -> Bundle:
    folder = Path(path)
    if not folder.exists():
        raise BundleError(f"bundle folder {folder} does not exist; check the path or run `specrt export`")
    if not folder.is_dir():
        raise BundleError(f"{folder} is a file, not a bundle folder; pass the folder that holds manifest.json")
    manifest = Manifest.read(folder)
    needed = [manifest.graph.model_file, manifest.graph.data_file, TOKENIZER_FILE]
    needed += [manifest.tokenizer.chat_template] if manifest.tokenizer.chat_template else []
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        raise BundleError(f"{folder}: missing {', '.join(missing)}; the bundle is incomplete, re-export it")
    return Bundle(folder, manifest)


def check_pair(target: Bundle, draft: Bundle) -> None:
    """A draft must speak the target's vocabulary exactly, or acceptance tests compare different tokens."""
    t, d = target.manifest, draft.manifest
    if t.tokenizer.sha256 != d.tokenizer.sha256:
        raise IncompatibleModelsError(
            f"draft and target tokenizers differ: target {target.path} has tokenizer "
            f"{t.tokenizer.sha256[:12]}, draft {draft.path} has {d.tokenizer.sha256[:12]}; "
            "use a draft exported from a model with the same tokenizer"
        )
    if t.architecture.vocab_size != d.architecture.vocab_size:
        raise IncompatibleModelsError(
            f"draft and target vocabulary sizes differ: target {t.architecture.vocab_size}, "
            f"draft {d.architecture.vocab_size}; use a draft whose vocab_size equals the target's"
        )
