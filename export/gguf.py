"""GGUF input: tensors streamed from a memory-mapped GGUF file, dequantized one at a time.

The `gguf` package reads the file (memory-mapped) and dequantizes each tensor (Q4_K, Q5_0, Q6_K, Q8_0, ...)
to float32. Names, the llama q/k un-permutation and the config come from transformers' own GGUF loader
pieces, so the weights are exactly those `from_pretrained(..., gguf_file=...)` would build, without ever
holding the whole float32 model.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExportError
from .source import Checkpoint, first_line

# End-of-turn tokens that chat fine-tunes stop on besides the GGUF's single eos id (transformers'
# generation_config for these models lists them too; GGUF files carry no generation_config).
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
)


def dropped_setting(arch: str, fields: dict[str, Any], config: Any) -> str | None:
    """A setting the GGUF file holds (or implies) that transformers' GGUF reader, which builds the config from a
    fixed list of keys and defaults for the rest, leaves out: exporting would build another model. None: none.

    - rope scaling (`<arch>.rope.scaling.type`, e.g. Gemma 3 4B-27B's linear x8 on its global layers) where the
      config has none;
    - Gemma 3's query scale: transformers defaults query_pre_attn_scalar to 256, right where head_dim is 256
      (270M-12B), wrong for the 27B (head_dim 128, scalar hidden / heads = 168; llama.cpp special-cases it).
    """
    kind = str(fields.get(f"{arch}.rope.scaling.type", "none"))
    if kind not in ("none", ""):
        rope = getattr(config, "rope_parameters", None) or {}
        tables = [t for t in rope.values() if isinstance(t, dict)] if "rope_type" not in rope else [rope]
        if all(t.get("rope_type", "default") == "default" for t in tables):
            factor = fields.get(f"{arch}.rope.scaling.factor", "?")
            return f"its rope scaling ({kind}, factor {factor}) is not read by transformers' GGUF loader"
    if arch == "gemma3" and getattr(config, "query_pre_attn_scalar", None) != getattr(config, "head_dim", None):
        return (
            f"transformers' GGUF loader sets Gemma 3's query_pre_attn_scalar to {config.query_pre_attn_scalar}, "
            f"right only where head_dim is {config.query_pre_attn_scalar} (this file's: {config.head_dim})"
        )
    return None


class GGUFCheckpoint(Checkpoint):
    format = "gguf"

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = path
        try:
            self.reader = GGUFReader(str(path))  # memory-mapped: no tensor data is read yet
        except Exception as e:
            raise ExportError(f"{path}: not a readable GGUF file ({first_line(e)})") from None
        self.config = self._load_config()
        fields = {name: field.contents() for name, field in self.reader.fields.items() if ".rope.scaling." in name}
        problem = dropped_setting(str(self.reader.fields["general.architecture"].contents()), fields, self.config)
        if problem:
            raise ExportError(f"{path}: {problem}; export from the model's Hugging Face folder instead")
        self._tensors = {t.name: t for t in self.reader.tensors}

    def _pretrained(self) -> tuple[Path, dict[str, Any]]:
        return self.path.parent, {"gguf_file": self.path.name}

    @property
    def weight_files(self) -> list[Path]:
        return [self.path]

    @cached_property
    def _hf_to_gguf(self) -> dict[str, str]:
        """transformers name -> GGUF tensor name, via transformers' mapping on a weightless (meta) model."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config)
        mapping = get_gguf_hf_weights_map(model, self._processor)
        return {hf: gg for gg, hf in mapping.items()}

    @cached_property
    def _processor(self) -> Any:
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        arch = str(self.reader.fields["general.architecture"].contents())
        return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=self.config.to_dict())

    def has(self, name: str) -> bool:
        return self._hf_to_gguf.get(name) in self._tensors

    def tensor(self, name: str) -> np.ndarray:
        from gguf import dequantize

        gguf_name = self._hf_to_gguf.get(name)
        if gguf_name not in self._tensors:
            raise ExportError(f"{self.path}: weight {name!r} is missing from the GGUF file")
        t = self._tensors[gguf_name]
        weights = dequantize(t.data, t.tensor_type)
        # llama-style GGUFs store q/k rows permuted for llama.cpp's rotary layout: undo it like transformers.
        weights = self._processor.process(weights=weights, name=gguf_name).weights
        return np.ascontiguousarray(weights, dtype=np.float32)

    def native(self, name: str) -> tuple[Any, str]:
        """The weight's own GGUF blocks (native.py), rows ordered as transformers orders them; None for a
        float tensor. A type native.py cannot carry exactly comes back re-quantized (marked not exact)."""
        from .native import FLOAT_TYPES, requantize_nearest, unpack

        gguf_name = self._hf_to_gguf.get(name)
        if gguf_name not in self._tensors:
            raise ExportError(f"{self.path}: weight {name!r} is missing from the GGUF file")
        t = self._tensors[gguf_name]
        kind = t.tensor_type.name
        if kind in FLOAT_TYPES or len(t.shape) != 2:
            return None, kind
        shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists dims innermost first: [K, N] -> HF [N, K]
        blocks = unpack(t.data, kind, shape)
        if blocks is None:
            return requantize_nearest(self.tensor(name), kind), kind
        # llama-style q/k rows are stored permuted for llama.cpp's rotary layout; blocks run along the
        # input dimension, so the un-permutation moves whole rows of codes, scales and offsets.
        index = np.arange(shape[0], dtype=np.float32)[:, None]
        order = self._processor.process(weights=index, name=gguf_name).weights[:, 0].astype(np.int64)
        blocks = blocks if np.array_equal(order, np.arange(shape[0])) else blocks.take_rows(order)
        return blocks.centred(), kind

    def extra_eos_ids(self, tok: Any) -> list[Any]:
        ids = []
        for field in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if field in self.reader.fields:
                ids.append(int(self.reader.fields[field].contents()))
        vocab = tok.get_vocab()
        return ids + [vocab[t] for t in END_OF_TURN_TOKENS if t in vocab]
