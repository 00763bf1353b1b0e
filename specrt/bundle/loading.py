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
from .tokenizer import TOKENIZER_FILE, Tokenizer, first_difference, id_tokens


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
    files pass at once; otherwise their id -> token mappings are computed from the files and compared, and
    the first id they disagree on is named. Vocabulary sizes (the models' logit rows) may differ only by
    padding rows the tokenizer never produces, and then the smaller side is re-exported padded to the
    larger (`--vocab-size`: its extra rows get probability 0), so both models' logits cover the same ids.
    """
    t, d = target.manifest, draft.manifest
    tokens = None
    if target.file_sha256(TOKENIZER_FILE) != draft.file_sha256(TOKENIZER_FILE):
        tokens, theirs = id_tokens(target.tokenizer_path), id_tokens(draft.tokenizer_path)
        differ = first_difference(tokens, theirs)
        if differ is not None:
            i, ours, other = differ
            raise IncompatibleModelsError(
                f"draft and target tokenizers differ at id {i}: target {target.path} has {ours!r}, draft "
                f"{draft.path} {other!r}; use a draft exported from a model with the same tokenizer"
            )
    vt, vd = t.architecture.vocab_size, d.architecture.vocab_size
    if vt != vd:
        highest = max(tokens if tokens is not None else id_tokens(target.tokenizer_path))
        smaller, role = (draft, "draft") if vd < vt else (target, "target")
        if highest < min(vt, vd):
            fix = (
                f"ids {min(vt, vd)}..{max(vt, vd) - 1} are padding (the tokenizer's highest id is {highest}): "
                f"re-export the {role} padded to the other's size, specrt export --model "
                f"{smaller.manifest.source.path} --role {role} --vocab-size {max(vt, vd)} ..."
            )
        else:
            fix = f"the tokenizer produces id {highest}, so the rows past {min(vt, vd)} are not padding"
        raise IncompatibleModelsError(f"draft and target vocabulary sizes differ: target {vt}, draft {vd}; {fix}")
