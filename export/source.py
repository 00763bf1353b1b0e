"""Reading a checkpoint: config, weights one tensor at a time, tokenizer, provenance.

Two inputs share one interface: a Hugging Face folder (`HFCheckpoint`) and a GGUF file
(`GGUFCheckpoint`, in gguf.py). Weights are never loaded as a whole: `tensor(name)` returns one tensor,
by its transformers name, as float32 numpy, so the exporter holds about one layer at a time. The
tokenizer, config and the PyTorch reference all come from transformers, so the bundle tokenizes exactly as
transformers does for the same input. This module does not build graphs.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle.manifest import TokenizerSpec
from ..bundle.tokenizer import TOKENIZER_FILE, tokenizer_hash
from ..errors import ExportError
from .progress import Progress

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class Checkpoint:
    """What the exporter needs from any input format."""

    format: str
    path: Path
    config: Any

    # Where transformers' from_pretrained finds this checkpoint: (folder, extra kwargs).
    def _pretrained(self) -> tuple[Path, dict[str, Any]]:
        raise NotImplementedError

    @property
    def weight_files(self) -> list[Path]:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def tensor(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def extra_eos_ids(self, tok: Any) -> list[Any]:
        """Format-specific end-of-turn ids, beyond the config's and the tokenizer's."""
        return []

    def native(self, name: str) -> tuple[Any, str]:
        """A weight in its file's own quantized form: (native.Blocks, or None for float tensors; its type)."""
        raise ExportError(f"{self.path}: --quant native carries a GGUF file's own quantized weights; pass a .gguf")

    def _load_config(self) -> Any:
        from transformers import AutoConfig

        folder, kwargs = self._pretrained()
        try:
            return AutoConfig.from_pretrained(folder, **kwargs)
        except Exception as e:
            raise ExportError(f"{self.path}: transformers cannot read the config: {first_line(e)}") from None

    def weights_sha256(self, progress: Progress) -> str:
        """The SHA-256 of the weight file, or for several files the SHA-256 of their "name:sha256" lines,
        so the bundle names exactly what it came from."""
        files = self.weight_files
        total = sum(f.stat().st_size for f in files)
        outer = hashlib.sha256()
        with progress.bar(total, "hashing weights", unit="B") as bar:
            for f in files:
                inner = hashlib.sha256()
                with open(f, "rb") as fh:
                    while chunk := fh.read(1 << 22):
                        inner.update(chunk)
                        bar.update(len(chunk))
                outer.update(f"{f.name}:{inner.hexdigest()}\n".encode())
        return inner.hexdigest() if len(files) == 1 else outer.hexdigest()

    def save_tokenizer(self, out: Path) -> TokenizerSpec:
        """Write tokenizer.json (+ chat template) into the bundle, exactly as transformers builds them."""
        from transformers import AutoTokenizer

        folder, kwargs = self._pretrained()
        try:
            tok = AutoTokenizer.from_pretrained(folder, **kwargs)
        except Exception as e:
            raise ExportError(
                f"{self.path}: no usable tokenizer ({first_line(e)}); the checkpoint needs tokenizer.json, "
                "the files transformers builds one from, or GGUF tokenizer metadata"
            ) from None
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is None:
            raise ExportError(f"{self.path}: tokenizer has no fast (tokenizers) form; specrt needs one")
        backend.save(str(out / TOKENIZER_FILE))
        files = [TOKENIZER_FILE]
        template = tok.chat_template if isinstance(tok.chat_template, str) else None
        if template:
            (out / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
            files.append(CHAT_TEMPLATE_FILE)
        eos: list[int] = []
        for value in [*self.extra_eos_ids(tok), getattr(self.config, "eos_token_id", None), tok.eos_token_id]:
            for i in value if isinstance(value, list) else [value]:
                if isinstance(i, int) and i not in eos:
                    eos.append(i)
        return TokenizerSpec(
            files=files,
            sha256=tokenizer_hash(out / TOKENIZER_FILE),
            eos_token_ids=eos,
            bos_token_id=tok.bos_token_id,
            pad_token_id=tok.pad_token_id,
            chat_template=CHAT_TEMPLATE_FILE if template else None,
            add_bos_token=bool(getattr(tok, "add_bos_token", False)),
        )

    def load_torch_model(self, quiet: bool = False) -> Any:
        """The PyTorch reference for validation (a full fp32 copy: only when validation is on)."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        if quiet:
            logging.disable_progress_bar()
        folder, kwargs = self._pretrained()
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()


class HFCheckpoint(Checkpoint):
    format = "hf-folder"

    def __init__(self, path: Path):
        self.path = path
        if not (path / "config.json").is_file():
            raise ExportError(f"{path}: no config.json; pass a Hugging Face model folder or a .gguf file")
        self.config = self._load_config()
        self._open: dict[str, Any] = {}

    def _pretrained(self) -> tuple[Path, dict[str, Any]]:
        return self.path, {}

    @cached_property
    def _index(self) -> dict[str, str]:
        """Tensor name -> file name, from the sharded index or the single weight file."""
        for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            index = self.path / index_name
            if index.is_file():
                return json.loads(index.read_text())["weight_map"]
        for single in ("model.safetensors", "pytorch_model.bin"):
            if (self.path / single).is_file():
                return dict.fromkeys(self._handle(single).keys(), single)
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

                path = self.path / file
                self._open[file] = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        return self._open[file]

    def has(self, name: str) -> bool:
        return name in self._index

    def tensor(self, name: str) -> np.ndarray:
        if name not in self._index:
            raise ExportError(f"{self.path}: weight {name!r} is missing from the checkpoint")
        h = self._handle(self._index[name])
        t = h.get_tensor(name) if hasattr(h, "get_tensor") else h[name]
        return t.float().numpy()

    def extra_eos_ids(self, tok: Any) -> list[Any]:
        gen = self.path / "generation_config.json"
        return [json.loads(gen.read_text()).get("eos_token_id")] if gen.is_file() else []


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
