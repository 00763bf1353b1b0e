"""The manifest: the one disk contract between the exporter and the runtime.

`manifest.json` describes everything the runtime needs to run a bundle: architecture figures, the graph's
input/output names, the KV buffer layout, quantization, tokenizer and generation defaults, plus provenance
(source weights hash, tool versions) and the validation figures measured at export. The exporter writes it
last, so a folder without a readable manifest is not a bundle. This module only (de)serialises it and checks
its schema and the ranges of its values; whether the files match it is integrity.py's job, and it knows
nothing about ONNX Runtime or tokenizers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BundleError, SchemaVersionError
from .integrity import KINDS, FileRecord, check_name
from .tokenizer import TOKENIZER_FILE

# 2: `files` records every file's size and SHA-256 (integrity checks at load). Version 1 bundles are refused
# with the command that re-exports them: they cannot prove their files are the ones exported.
SCHEMA_VERSION = 2
MANIFEST_FILE = "manifest.json"
# Measured step costs, per machine (specrt.tuning writes them; not hashed: they are not part of the contract).
PROFILE_DIR = "profiles"
ROLES = ("target", "draft")
_HEX64 = re.compile(r"[0-9a-f]{64}")
QUANT_BITS = {"none": None, "int8": 8, "int4": 4, "native": None}
MAX_LAYERS = 4096
_GQA_INPUTS = ("seqlens_k", "total_sequence_length", "logits_to_keep")  # its mask is the operator's own
FLAVOUR_INPUTS = {  # besides input_ids and the KV buffers, per flavour and per `graph.masks`
    ("standard", "graph"): ("write_index", "new_tokens", "logits_rows"),
    ("standard", "runtime"): ("position_ids", "write_index", "attention_mask", "logits_rows"),
    ("gqa", "graph"): _GQA_INPUTS,
    ("gqa", "runtime"): _GQA_INPUTS,
}
FLAVOURS = ("standard", "gqa")
MASKS = ("graph", "runtime")
# The bundle's dtype (activations, float weights) -> its KV buffers' element type (graph.kv_dtype).
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MAX_MANIFEST_BYTES = 16 << 20


PAD_LOGIT = -1e30  # the logit of a padding id (Architecture.padded_from): exp() of it is exactly 0 in float32


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
    # Exported with `--vocab-size` past the checkpoint's own rows (a draft padded to its target's vocabulary):
    # those rows. Ids from it on are padding the tokenizer never produces: zero embeddings, and logits at
    # PAD_LOGIT, so probability 0 (a draft's q is exactly 0 there and verification stays exact).
    padded_from: int | None = None


@dataclass(frozen=True)
class Quantization:
    method: str = "none"  # none | int8 | int4
    bits: int | None = None
    block_size: int | None = None
    accuracy_level: int | None = None
    symmetric: bool = True
    lm_head: bool = False  # whether the LM head is quantized too (embeddings never are)
    # native (GGUF's own blocks): per weight, its GGUF type and what the graph carries it as
    tensors: dict[str, str] = field(default_factory=dict)
    lm_head_bits: int | None = None  # a quantized head in its own format (8 or 4); None: as the body
    form: str = "nbits"  # nbits: com.microsoft.MatMulNBits; qdq: DequantizeLinear + MatMul (standard ops)


@dataclass(frozen=True)
class GraphSpec:
    """Graph file and tensor names. KV names are templates formatted with `layer=i`.

    flavour "standard": ai.onnx ops, any batch; inputs input_ids, write_index, new_tokens, logits_rows (masks
    "graph": positions and the causal mask built inside) or, in bundles exported before that, input_ids,
    position_ids, write_index, attention_mask, logits_rows (masks "runtime"). flavour "gqa":
    com.microsoft.GroupQueryAttention, batch 1; inputs input_ids, seqlens_k, total_sequence_length,
    logits_to_keep (its mask is always the operator's own). engines/README.md documents the contracts."""

    model_file: str = "model.onnx"
    data_file: str = "model.onnx.data"
    flavour: str = "gqa"
    input_ids: str = "input_ids"
    # standard: who builds positions and the attention mask. A manifest without the field is from before the
    # graph built them ("runtime"); the exporter writes "graph".
    masks: str = "runtime"
    write_index: str = "write_index"
    new_tokens: str = "new_tokens"
    logits_rows: str = "logits_rows"
    position_ids: str = "position_ids"  # masks "runtime" only
    attention_mask: str = "attention_mask"  # masks "runtime" only
    # gqa
    seqlens_k: str = "seqlens_k"
    total_sequence_length: str = "total_sequence_length"
    logits_to_keep: str = "logits_to_keep"
    logits: str = "logits"
    # Each logits row's greedy token and its probability, computed in the model's run when the input
    # top_mode asks (0: neither, 1: the token, 2: both); empty in bundles exported before they existed.
    top_mode: str = ""
    top_token: str = ""
    top_confidence: str = ""
    # standard, masks "graph": the input [1] to which the attended length T = max(past + new) is rounded up
    # (1: exact; a multiple of 64 gives a GPU a small fixed set of shapes); empty in bundles from before it.
    attend_bucket: str = ""
    # standard, masks "graph": the input [1] that IS T, sent by the runtime (>= max(past + new): rounded up
    # to its bucket); empty in bundles from before it (which compute T themselves, rounded to attend_bucket).
    attend_length: str = ""
    past_key: str = "past_key_values.{layer}.key"
    past_value: str = "past_key_values.{layer}.value"
    present_key: str = "present.{layer}.key"
    present_value: str = "present.{layer}.value"
    # KV buffers are [batch, kv_heads, max_seq_len, head_dim]; present is bound to the same buffer as past.
    kv_layout: str = "batch,kv_heads,max_seq_len,head_dim"
    kv_dtype: str = "float32"
    attention: str = "com.microsoft.GroupQueryAttention"
    opset: int = 18

    def inputs(self) -> tuple[str, ...]:
        """The graph's inputs other than the KV buffers."""
        extra = tuple(name for name in (self.top_mode, self.attend_bucket, self.attend_length) if name)
        return (self.input_ids, *(getattr(self, name) for name in FLAVOUR_INPUTS[self.flavour, self.masks]), *extra)

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
    files: list[FileRecord] = field(default_factory=list)  # every file of the bundle but the manifest itself
    # Why TensorRT's ONNX parser would refuse the model graph (export/tensorrt.py): [] when it takes it; None
    # in bundles exported before the check.
    tensorrt: list[str] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = MANIFEST_FILE) -> Manifest:
        if not isinstance(data, dict):
            raise BundleError(f"{where}: expected a JSON object; re-export the bundle")
        version = data.get("schema_version")
        if not (type(version) is int and version == SCHEMA_VERSION):
            raise SchemaVersionError(_version_message(data, where))
        manifest = _build(cls, data, where)
        _check(manifest, where)
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
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise BundleError(f"{path}: {path.stat().st_size} bytes is not a manifest (at most 16 MiB); re-export")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, absurd nesting or number lengths
            raise BundleError(f"{path}: not valid JSON ({_first_line(e)}); re-export the bundle") from None
        return cls.from_dict(data, where=str(path))


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _version_message(data: dict, where: str) -> str:
    version = data.get("schema_version")
    message = f"{where}: manifest schema version {version!r} is not supported by this specrt (reads version "
    message += f"{SCHEMA_VERSION}); "
    if type(version) is int and 0 < version < SCHEMA_VERSION:
        # An older bundle: say exactly how to rebuild it, from what its manifest says it was built from.
        source, role = data.get("source"), data.get("role")
        quant = data.get("quantization") if isinstance(data.get("quantization"), dict) else {}
        model = source.get("path") if isinstance(source, dict) else None
        folder = Path(where).parent
        if isinstance(model, str) and isinstance(role, str) and role in ROLES:  # any JSON value: a list is unhashable
            q = quant.get("method")
            q = q if isinstance(q, str) and q in QUANT_BITS else "none"  # only a known method's name is repeated
            return message + (
                "its files carry no integrity record; re-export it: specrt export --model "
                f"{model} --role {role} --quant {q} --out {folder} --overwrite"
            )
        return message + "its files carry no integrity record; re-export it with `specrt export ... --overwrite`"
    return message + "re-export the bundle with this specrt version"


def _check(m: Manifest, where: str) -> None:
    """Values the runtime relies on, in range: a manifest that passes can be loaded without surprises."""
    a, q, t = m.architecture, m.quantization, m.tokenizer

    def need(ok: bool, what: str, value: Any, expected: str) -> None:
        if not ok:
            raise BundleError(f"{where}: {what} must be {expected}, got {value!r}; re-export the bundle")

    need(m.role in ROLES, "role", m.role, " or ".join(ROLES))
    need(1 <= a.num_layers <= MAX_LAYERS, "architecture.num_layers", a.num_layers, f"in 1..{MAX_LAYERS}")
    for name in ("num_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size"):
        need(getattr(a, name) >= 1, f"architecture.{name}", getattr(a, name), ">= 1")
    need(a.num_heads % a.num_kv_heads == 0, "architecture.num_heads", a.num_heads, "a multiple of num_kv_heads")
    for name in ("rms_norm_eps", "rope_theta"):
        value = getattr(a, name)
        need(math.isfinite(value) and value > 0, f"architecture.{name}", value, "a finite number > 0")
    need(a.sliding_window is None or a.sliding_window >= 1, "architecture.sliding_window", a.sliding_window, ">= 1")
    need(m.max_seq_len >= 2, "max_seq_len", m.max_seq_len, ">= 2")
    need(m.dtype in DTYPES, "dtype", m.dtype, " or ".join(DTYPES))
    kv = DTYPES.get(m.dtype)
    need(m.graph.kv_dtype == kv, "graph.kv_dtype", m.graph.kv_dtype, f"{kv!r} for dtype {m.dtype}")
    need(q.method in QUANT_BITS, "quantization.method", q.method, " or ".join(QUANT_BITS))
    need(q.bits == QUANT_BITS.get(q.method), "quantization.bits", q.bits, f"{QUANT_BITS.get(q.method)} for {q.method}")
    need(q.lm_head_bits in (None, 4, 8), "quantization.lm_head_bits", q.lm_head_bits, "4, 8 or null")
    need(q.form in ("nbits", "qdq"), "quantization.form", q.form, "nbits or qdq")
    need(m.graph.flavour in FLAVOURS, "graph.flavour", m.graph.flavour, " or ".join(FLAVOURS))
    need(m.graph.masks in MASKS, "graph.masks", m.graph.masks, " or ".join(MASKS))
    for name in ("model_file", "data_file", "input_ids", "logits", *FLAVOUR_INPUTS[m.graph.flavour, m.graph.masks]):
        need(bool(getattr(m.graph, name)), f"graph.{name}", getattr(m.graph, name), "a non-empty name")
    for name in ("past_key", "past_value", "present_key", "present_value"):
        template = getattr(m.graph, name)
        try:
            ok = template.format(layer=0) != template.format(layer=1)
        except (KeyError, IndexError, ValueError, AttributeError):
            ok = False
        need(ok, f"graph.{name}", template, "a name template with {layer}")
    ids = [*t.eos_token_ids, *(i for i in (t.bos_token_id, t.pad_token_id) if i is not None)]
    for token_id in ids:
        need(0 <= token_id < a.vocab_size, "a tokenizer special token id", token_id, f"in [0, {a.vocab_size})")
    named = {"graph.model_file": m.graph.model_file, "graph.data_file": m.graph.data_file}
    named.update({f"tokenizer.files[{i}]": name for i, name in enumerate(t.files)})
    named.update({"tokenizer.chat_template": t.chat_template} if t.chat_template else {})
    named.update({f"files[{i}].name": f.name for i, f in enumerate(m.files)})
    for what, name in named.items():
        check_name(name, what, where)
    names = [f.name for f in m.files]
    need(len(set(names)) == len(names), "files", names, "a list of distinct file names")
    for f in m.files:
        need(f.kind in KINDS, f"files[{f.name!r}].kind", f.kind, " or ".join(KINDS))
        need(f.size >= 0, f"files[{f.name!r}].size", f.size, ">= 0")
        need(_HEX64.fullmatch(f.sha256) is not None, f"files[{f.name!r}].sha256", f.sha256, "64 hex digits")
    needed = {m.graph.model_file: "graph", m.graph.data_file: "weights", TOKENIZER_FILE: "tokenizer"}
    if t.chat_template:
        needed[t.chat_template] = "chat_template"
    recorded = {f.name: f.kind for f in m.files}
    for name, kind in needed.items():
        if recorded.get(name) != kind:
            raise BundleError(
                f"{where}: files holds no record of {name!r} as the {kind} file (it records "
                f"{', '.join(sorted(recorded)) or 'nothing'}); re-export the bundle"
            )


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
