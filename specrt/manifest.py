"""The manifest: the one disk contract between the exporter and the runtime.

`manifest.json` describes everything the runtime needs to run a bundle: architecture figures, the graph's
input/output names, the KV buffer layout, quantization, tokenizer and generation defaults, plus provenance
(source weights hash, tool versions) and the validation figures measured at export. The exporter writes it
last, so a folder without a readable manifest is not a bundle. This module only (de)serialises and checks
the schema; it knows nothing about ONNX Runtime or tokenizers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BundleError, SchemaVersionError

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
ROLES = ("target", "draft")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_type: str
    rope_theta: float
    tie_word_embeddings: bool
    sliding_window: int | None = None


@dataclass(frozen=True)
class Quantization:
    method: str = "none"  # none | int8 | int4
    bits: int | None = None
    block_size: int | None = None
    accuracy_level: int | None = None
    symmetric: bool = True
    lm_head: bool = False  # whether the LM head is quantized too (embeddings never are)


@dataclass(frozen=True)
class GraphSpec:
    """Graph file and tensor names. KV names are templates formatted with `layer=i`."""

    model_file: str = "model.onnx"
    data_file: str = "model.onnx.data"
    input_ids: str = "input_ids"
    seqlens_k: str = "seqlens_k"
    total_sequence_length: str = "total_sequence_length"
    logits_to_keep: str = "logits_to_keep"
    logits: str = "logits"
    past_key: str = "past_key_values.{layer}.key"
    past_value: str = "past_key_values.{layer}.value"
    present_key: str = "present.{layer}.key"
    present_value: str = "present.{layer}.value"
    # KV buffers are [batch, kv_heads, max_seq_len, head_dim]; present is bound to the same buffer as past.
    kv_layout: str = "batch,kv_heads,max_seq_len,head_dim"
    kv_dtype: str = "float32"
    attention: str = "com.microsoft.GroupQueryAttention"
    opset: int = 18

    def kv_names(self, layer: int) -> tuple[str, str, str, str]:
        """(past_key, past_value, present_key, present_value) of one layer."""
        return (
            self.past_key.format(layer=layer),
            self.past_value.format(layer=layer),
            self.present_key.format(layer=layer),
            self.present_value.format(layer=layer),
        )


@dataclass(frozen=True)
class TokenizerSpec:
    files: list[str]
    sha256: str  # hash of the canonical tokenizer.json (vocabulary, merges, added tokens, normalisation)
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    chat_template: str | None = None  # file name inside the bundle
    add_bos_token: bool = False


@dataclass(frozen=True)
class Source:
    path: str
    format: str  # hf-folder | gguf
    weights_sha256: str
    weight_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ValidationStep:
    name: str
    past: int
    new_tokens: int
    max_abs_diff: float
    top1_agreement: float


@dataclass(frozen=True)
class Validation:
    reference: str  # what the graph was compared with
    steps: list[ValidationStep]
    max_abs_diff: float
    top1_agreement: float
    tolerance: float | None  # None: figures recorded, not gated (quantized graphs)
    passed: bool


@dataclass(frozen=True)
class Manifest:
    name: str
    role: str
    created: str
    source: Source
    architecture: Architecture
    max_seq_len: int
    dtype: str
    quantization: Quantization
    graph: GraphSpec
    tokenizer: TokenizerSpec
    versions: dict[str, str]
    validation: Validation | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = MANIFEST_FILE) -> Manifest:
        if not isinstance(data, dict):
            raise BundleError(f"{where}: expected a JSON object; re-export the bundle")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where}: manifest schema version {version!r} is not supported by this specrt "
                f"(reads version {SCHEMA_VERSION}); re-export the bundle with this specrt version"
            )
        manifest = _build(cls, data, where)
        if manifest.role not in ROLES:
            raise BundleError(f"{where}: role {manifest.role!r} is not one of {', '.join(ROLES)}")
        return manifest

    def write(self, folder: str | os.PathLike) -> Path:
        """Write atomically: a half-written manifest must never look like a finished bundle."""
        path = Path(folder) / MANIFEST_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, folder: str | os.PathLike) -> Manifest:
        path = Path(folder) / MANIFEST_FILE
        if not path.is_file():
            raise BundleError(
                f"{folder}: no {MANIFEST_FILE}, so this is not a finished bundle; "
                "build one with `specrt export --model PATH --role target|draft --out DIR`"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BundleError(f"{path}: not valid JSON ({e}); re-export the bundle") from None
        return cls.from_dict(data, where=str(path))


def _build(cls: type, data: Any, where: str) -> Any:
    """Build a (nested) dataclass from plain JSON data, naming the first missing or mistyped field."""
    if not isinstance(data, dict):
        raise BundleError(f"{where}: expected an object for {cls.__name__}; re-export the bundle")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise BundleError(f"{where}: missing field {cls.__name__}.{f.name}; re-export the bundle")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}: {cls.__name__}.{f.name}")
    return cls(**kwargs)


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        return _convert(tp, value, where)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise BundleError(f"{where}: expected a list; re-export the bundle")
        return [_convert(args[0], v, where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise BundleError(f"{where}: expected an object; re-export the bundle")
        return dict(value)
    ok = {
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        bool: lambda v: isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }.get(tp)
    if ok is not None and not ok(value):
        raise BundleError(f"{where}: expected {tp.__name__}, got {value!r}; re-export the bundle")
    return float(value) if tp is float else value
