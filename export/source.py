"""Reading a Hugging Face checkpoint folder: config, weights one tensor at a time, tokenizer, provenance.

Weights are never loaded as a whole: `tensor(name)` opens one tensor lazily from safetensors (or a
memory-mapped PyTorch .bin) and returns it as float32 numpy, so the exporter holds about one layer at a
time. This module does not build graphs.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExportError
from ..manifest import TokenizerSpec
from ..tokenizer import TOKENIZER_FILE, tokenizer_hash
from .progress import Progress

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class HFCheckpoint:
    format = "hf-folder"

    def __init__(self, path: Path):
        from transformers import AutoConfig

        self.path = path
        if not (path / "config.json").is_file():
            raise ExportError(f"{path}: no config.json; pass a Hugging Face model folder or a .gguf file")
        try:
            self.config = AutoConfig.from_pretrained(path)
        except Exception as e:
            raise ExportError(
                f"{path}/config.json cannot be read by transformers: {_first_line(e)}"
            ) from None
        self._open: dict[str, Any] = {}

    @cached_property
    def _index(self) -> dict[str, str]:
        """Tensor name -> file name, from the sharded index or the single weight file."""
        for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            index = self.path / index_name
            if index.is_file():
                return json.loads(index.read_text())["weight_map"]
        for single in ("model.safetensors", "pytorch_model.bin"):
            if (self.path / single).is_file():
                return dict.fromkeys(self._names_in(single), single)
        raise ExportError(
            f"{self.path}: no model.safetensors or pytorch_model.bin (nor a sharded index); "
            "is this a complete Hugging Face model folder?"
        )

    @property
    def weight_files(self) -> list[Path]:
        return sorted({self.path / f for f in self._index.values()})

    def _handle(self, file: str) -> Any:
        if file not in self._open:
            if file.endswith(".safetensors"):
                from safetensors import safe_open

                self._open[file] = safe_open(str(self.path / file), framework="pt")
            else:
                import torch

                self._open[file] = torch.load(
                    self.path / file, map_location="cpu", mmap=True, weights_only=True
                )
        return self._open[file]

    def _names_in(self, file: str) -> list[str]:
        h = self._handle(file)
        return list(h.keys())

    def has(self, name: str) -> bool:
        return name in self._index

    def tensor(self, name: str) -> np.ndarray:
        if name not in self._index:
            raise ExportError(f"{self.path}: weight {name!r} is missing from the checkpoint")
        h = self._handle(self._index[name])
        t = h.get_tensor(name) if hasattr(h, "get_tensor") else h[name]
        return t.float().numpy()

    def weights_sha256(self, progress: Progress) -> str:
        """One hash over the weight files (each streamed), so the bundle names exactly what it came from."""
        total = sum(f.stat().st_size for f in self.weight_files)
        outer = hashlib.sha256()
        with progress.bar(total, "hashing weights", unit="B") as bar:
            for f in self.weight_files:
                inner = hashlib.sha256()
                with open(f, "rb") as fh:
                    while chunk := fh.read(1 << 22):
                        inner.update(chunk)
                        bar.update(len(chunk))
                outer.update(f"{f.name}:{inner.hexdigest()}\n".encode())
        return outer.hexdigest()

    def save_tokenizer(self, out: Path) -> TokenizerSpec:
        """Write tokenizer.json (+ config and chat template) into the bundle and describe them."""
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(self.path)
        except Exception as e:
            raise ExportError(
                f"{self.path}: no usable tokenizer ({_first_line(e)}); the folder needs tokenizer.json "
                "or the files transformers builds one from"
            ) from None
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is None:
            raise ExportError(
                f"{self.path}: tokenizer has no fast (tokenizers) form; specrt needs tokenizer.json"
            )
        backend.save(str(out / TOKENIZER_FILE))
        files = [TOKENIZER_FILE]
        template = tok.chat_template if isinstance(tok.chat_template, str) else None
        if template:
            (out / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
            files.append(CHAT_TEMPLATE_FILE)
        return TokenizerSpec(
            files=files,
            sha256=tokenizer_hash(out / TOKENIZER_FILE),
            eos_token_ids=self._eos_ids(tok),
            bos_token_id=tok.bos_token_id,
            pad_token_id=tok.pad_token_id,
            chat_template=CHAT_TEMPLATE_FILE if template else None,
            add_bos_token=bool(getattr(tok, "add_bos_token", False)),
        )

    def _eos_ids(self, tok: Any) -> list[int]:
        """Every id that ends a turn: generation_config's list, the config's, the tokenizer's."""
        ids: list[int] = []
        gen = self.path / "generation_config.json"
        sources = [json.loads(gen.read_text()).get("eos_token_id")] if gen.is_file() else []
        sources += [getattr(self.config, "eos_token_id", None), tok.eos_token_id]
        for value in sources:
            for i in value if isinstance(value, list) else [value]:
                if isinstance(i, int) and i not in ids:
                    ids.append(i)
        return ids

    def load_torch_model(self, quiet: bool = False) -> Any:
        """The PyTorch reference for validation (a full fp32 copy: only when validation is on)."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        if quiet:
            logging.disable_progress_bar()

        return AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).eval()


def open_checkpoint(path: str | Path) -> HFCheckpoint:
    p = Path(path)
    if not p.exists():
        raise ExportError(f"model path {p} does not exist")
    if p.is_file():
        if p.suffix == ".gguf":
            raise ExportError(f"{p}: GGUF input is not supported yet; pass a Hugging Face model folder")
        raise ExportError(f"{p} is a file; pass a Hugging Face model folder (config.json + weights)")
    return HFCheckpoint(p)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
