"""A bundle folder on disk: its manifest, the files the manifest names, and its tokenizer.

`open_bundle` checks that the folder is a finished bundle before anything heavy is loaded: the manifest
is readable and in range, every file it names stays inside the folder, and every file is the one the
exporter wrote (integrity.py: sizes always, hashes of the small files always, of the weights on request).
`check_pair` decides whether a draft may serve a target, from the verified tokenizer files. Loading the
graph into ONNX Runtime is the session module's job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleError, IncompatibleModelsError
from .integrity import FileCheck, check_files, resolve_inside
from .manifest import Manifest
from .tokenizer import TOKENIZER_FILE, Tokenizer, tokenizer_hash


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: Manifest
    checks: tuple[FileCheck, ...] = ()  # what open_bundle found for each file

    @property
    def model_path(self) -> Path:
        return self.path / self.manifest.graph.model_file

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE

    @property
    def name(self) -> str:
        return self.manifest.name

    def file_sha256(self, name: str) -> str:
        return next(f.sha256 for f in self.manifest.files if f.name == name)

    def load_tokenizer(self) -> Tokenizer:
        spec = self.manifest.tokenizer
        template = None
        if spec.chat_template:
            try:
                template = (self.path / spec.chat_template).read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise BundleError(f"{self.path / spec.chat_template}: not UTF-8 text ({e.reason}); re-export") from None
        return Tokenizer(
            self.tokenizer_path,
            eos_token_ids=spec.eos_token_ids,
            bos_token_id=spec.bos_token_id,
            chat_template=template,
        )


def open_bundle(path: str | os.PathLike, verify: bool = False) -> Bundle:
    """Open a bundle folder and check its files against the manifest (all hashes when `verify`)."""
    folder, manifest = read_manifest(path)
    checks = check_files(folder, manifest.files, full=verify)
    return Bundle(folder, manifest, tuple(checks))


def read_manifest(path: str | os.PathLike) -> tuple[Path, Manifest]:
    """The folder's manifest, in range, with every file name it holds inside the folder (files unchecked)."""
    folder = Path(path)
    if not folder.exists():
        raise BundleError(f"bundle folder {folder} does not exist; check the path or run `specrt export`")
    if not folder.is_dir():
        raise BundleError(f"{folder} is a file, not a bundle folder; pass the folder that holds manifest.json")
    manifest = Manifest.read(folder)  # every name in it is plain and relative
    names = [manifest.graph.model_file, manifest.graph.data_file, *manifest.tokenizer.files]
    names += [manifest.tokenizer.chat_template] if manifest.tokenizer.chat_template else []
    for name in {*names, *(f.name for f in manifest.files)}:
        resolve_inside(folder, name, "file")  # and no symlink leads out of the folder
    return folder, manifest


def check_pair(target: Bundle, draft: Bundle) -> None:
    """A draft must speak the target's vocabulary exactly, or acceptance tests compare different tokens.

    Compared: the tokenizer files open_bundle verified, never a hash the manifests merely state. Identical
    files pass at once; otherwise their id -> token mappings are computed from the files and compared.
    """
    t, d = target.manifest, draft.manifest
    if target.file_sha256(TOKENIZER_FILE) != draft.file_sha256(TOKENIZER_FILE):
        ours, theirs = tokenizer_hash(target.tokenizer_path), tokenizer_hash(draft.tokenizer_path)
        if ours != theirs:
            raise IncompatibleModelsError(
                f"draft and target tokenizers differ: target {target.path} maps token ids as {ours[:12]}, "
                f"draft {draft.path} as {theirs[:12]}; use a draft exported from a model with the same tokenizer"
            )
    if t.architecture.vocab_size != d.architecture.vocab_size:
        raise IncompatibleModelsError(
            f"draft and target vocabulary sizes differ: target {t.architecture.vocab_size}, "
            f"draft {d.architecture.vocab_size}; use a draft whose vocab_size equals the target's"
        )
