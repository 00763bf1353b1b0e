"""The export pipeline: checkpoint -> graph + tokenizer -> validation -> manifest (written last).

`export_bundle` is what `specrt export` runs. Any failure leaves the output folder without a manifest,
so a half-built folder is never mistaken for a bundle.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from ..bundle.integrity import record
from ..bundle.manifest import DTYPES, MANIFEST_FILE, PROFILE_DIR, ROLES, Architecture, Manifest, Quantization, Source
from ..bundle.tokenizer import TOKENIZER_FILE, id_tokens
from ..errors import ExportError, UnsupportedModelError
from .archs import ArchSpec, lookup
from .attention import FLAVOURS
from .progress import Progress
from .sampler import FOLDER as SAMPLER_FOLDER
from .sampler import write_samplers
from .source import Checkpoint, HFCheckpoint
from .tensorrt import check_file as check_tensorrt

QUANT_METHODS = {"none": None, "int8": 8, "int4": 4, "native": None}
LM_HEAD_FORMATS = ("quantized", "int8", "int4", "fp32")
# The defaults `specrt export` uses where the command leaves them open, chosen from the kernel study
# (docs/quantization.md, results/quant/). A target's weights decide the output, so a target keeps the
# exact weights of its input: fp32 from a Hugging Face folder, the file's own blocks from a GGUF (native:
# top-1 agreement 0.997 with the fp32 bundle, against 0.94-0.96 for re-quantized int4, at 1.3x the int4
# step time). A draft only proposes, so it takes the fastest 1-token step: int4 in blocks of 128 (0.85x the
# step time of blocks of 32, the same agreement with the target's tokens, 0.84-0.85).
ROLE_DEFAULTS = {("target", "hf-folder"): "none", ("target", "gguf"): "native", ("draft", "hf-folder"): "int4"}
ROLE_DEFAULTS[("draft", "gguf")] = "int4"
QUANT_DEFAULTS = {
    ("target", "int4"): {"block_size": 32, "accuracy_level": 4},
    ("draft", "int4"): {"block_size": 128, "accuracy_level": 4},
    ("target", "int8"): {"block_size": 32, "accuracy_level": 4},
    ("draft", "int8"): {"block_size": 32, "accuracy_level": 4},
    ("target", "native"): {"accuracy_level": 4},
    ("draft", "native"): {"accuracy_level": 4},
}
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_BUNDLE_FILES = ("manifest.json", "model.onnx", "model.onnx.data", "tokenizer.json", "chat_template.jinja")


@dataclass(frozen=True)
class ExportOptions:
    role: str = "target"
    max_seq_len: int | None = None  # default: min(max_position_embeddings, 4096)
    dtype: str = "fp32"  # activations, KV buffers and float weights: fp32 | fp16 | bf16 (norm statistics,
    # the final norm, the LM head and the logits stay float32)
    quant: str = "none"  # none | int8 | int4 (MatMulNBits, block-wise) | native (a GGUF's own blocks)
    block_size: int = 32
    accuracy_level: int = 4  # MatMulNBits compute type: 4 = int8 activations (fastest on CPU)
    symmetric: bool = True  # False: a zero point per block (int4/int8)
    lm_head: str = "quantized"  # quantized (as the body) | int8 | int4 | fp32
    graph: str = "standard"  # standard (ai.onnx ops, any batch) | gqa (GroupQueryAttention, batch 1)
    # quantized weights as DequantizeLinear + MatMul (qdq: no contrib op; ONNX Runtime fuses the pair into
    # MatMulNBits at the same speed, docs/graph-flavours.md) or MatMulNBits itself (nbits); None: qdq for
    # the standard graph, nbits beside GroupQueryAttention (a contrib-op graph anyway)
    weights: str | None = None
    # Who builds positions and the attention mask: the graph (what the exporter writes) or the runtime (the
    # form of bundles exported before, which the runtime still runs; written only by the tests that keep it
    # so). Not a CLI option.
    masks: str = "graph"
    validate: bool = True
    name: str | None = None
    overwrite: bool = False
    # Pad the vocabulary (embedding and logit rows) to this many ids: the checkpoint's rows past its own
    # vocab_size become padding of probability 0, for a pair whose vocabularies differ only in padding.
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ExportError(f"role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.dtype not in DTYPES:
            raise ExportError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.quant not in QUANT_METHODS:
            raise ExportError(f"quant {self.quant!r} is not one of {', '.join(QUANT_METHODS)}")
        if self.block_size not in (16, 32, 64, 128, 256):
            raise ExportError(f"block size {self.block_size} is not one of 16, 32, 64, 128, 256")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ExportError(f"accuracy level {self.accuracy_level} is not in 0..4")
        if self.graph not in FLAVOURS:
            raise ExportError(f"graph {self.graph!r} is not one of {', '.join(FLAVOURS)}")
        if self.weights is None:
            object.__setattr__(self, "weights", "qdq" if self.graph == "standard" else "nbits")
        if self.weights not in ("nbits", "qdq"):
            raise ExportError(f"weights {self.weights!r} is not one of nbits, qdq")
        if self.masks not in ("graph", "bucket", "runtime"):
            raise ExportError(f"masks {self.masks!r} is not one of graph, bucket, runtime")
        if self.lm_head not in LM_HEAD_FORMATS:
            raise ExportError(f"lm_head {self.lm_head!r} is not one of {', '.join(LM_HEAD_FORMATS)}")
        if self.max_seq_len is not None and self.max_seq_len < 32:
            raise ExportError(f"max_seq_len {self.max_seq_len} is too small; use at least 32")

    @classmethod
    def for_role(
        cls,
        role: str,
        quant: str | None = None,
        block_size: int | None = None,
        accuracy_level: int | None = None,
        lm_head: str | None = None,
        model_format: str = "hf-folder",
        **kw,
    ) -> ExportOptions:
        """Options with the measured-best defaults for the role (and input format: hf-folder or gguf) filled
        in where the caller left them open."""
        quant = quant or ROLE_DEFAULTS[(role, model_format)]
        defaults = QUANT_DEFAULTS.get((role, quant), {})
        return cls(
            role=role,
            quant=quant,
            block_size=block_size or defaults.get("block_size", 32),
            accuracy_level=defaults.get("accuracy_level", 4) if accuracy_level is None else accuracy_level,
            lm_head=lm_head or "quantized",
            **kw,
        )

    @property
    def quant_label(self) -> str:
        return self.quant if self.quant != "none" else self.dtype

    def quantization(self) -> Quantization:
        bits = QUANT_METHODS[self.quant]
        head_bits = QUANT_METHODS.get(self.lm_head)  # int8/int4: that format, whatever the body's
        common = dict(accuracy_level=self.accuracy_level, lm_head=self.lm_head != "fp32", lm_head_bits=head_bits)
        if self.quant == "native":  # mixed per tensor: `tensors` records what each became
            return Quantization("native", symmetric=False, form=self.weights, **common)
        if bits is None and head_bits is None:
            return Quantization()
        # (an unquantized body may still take a quantized head)
        return Quantization(self.quant, bits, self.block_size, symmetric=self.symmetric, form=self.weights, **common)


def architecture_of(config, spec: ArchSpec) -> Architecture:
    act = spec.activation(config)
    if act not in spec.hidden_acts:
        raise UnsupportedModelError(
            f"hidden_act {act!r} is not supported for {spec.model_type}; supported: {', '.join(spec.hidden_acts)}"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    # One table, or one per layer type (Gemma 3: {"sliding_attention": {...}, "full_attention": {...}}).
    tables = [rope[t] for t in sorted(set(config.layer_types)) if rope.get(t)] if spec.rope_per_layer_type else []
    for table in tables or [rope]:
        rope_type = table.get("rope_type", table.get("type", "default"))
        if rope_type not in (*STATIC_ROPE_TYPES, "longrope"):  # longrope: its short table, checked at export
            raise UnsupportedModelError(
                f"rope_type {rope_type!r} is not supported (its tables depend on the sequence length); "
                f"supported: {', '.join(STATIC_ROPE_TYPES)}, and longrope up to its original context"
            )
        if float(table.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0) != 1.0:
            raise UnsupportedModelError(
                "partial_rotary_factor below 1 (rotary embedding on part of each head) is not supported"
            )
    rope = rope.get("full_attention", rope) if tables else rope  # the manifest names the global layers' table
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim % 16:
        raise UnsupportedModelError(
            f"head_dim {head_dim} is not supported: GroupQueryAttention with rotary embedding needs a multiple of 16"
        )
    return Architecture(
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_type=rope_type,
        rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        sliding_window=getattr(config, "sliding_window", None),
    )


def _require_extras() -> None:
    import importlib

    for name in ("torch", "transformers", "onnx", "safetensors"):
        try:
            importlib.import_module(name)
        except ImportError:
            raise ExportError(
                f"the exporter needs {name}, which is not installed: pip install 'specrt[export]'"
            ) from None


def _prepare_out(out: Path, model_path: Path, overwrite: bool) -> None:
    if out.resolve() == model_path.resolve():
        raise ExportError(f"--out {out} is the model folder itself; choose a new folder")
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"--out {out} is a file; choose a folder")
        present = {p.name for p in out.iterdir()}
        if MANIFEST_FILE in present and not overwrite:
            raise ExportError(f"{out} already holds a bundle; pass --overwrite to replace it")
        foreign = present - set(_BUNDLE_FILES) - {MANIFEST_FILE + ".tmp", PROFILE_DIR, SAMPLER_FOLDER}
        if foreign:
            raise ExportError(
                f"{out} holds other files ({', '.join(sorted(foreign)[:3])}); export into an empty folder"
            )
        (out / MANIFEST_FILE).unlink(missing_ok=True)  # the folder is no longer a bundle until we finish
        shutil.rmtree(out / PROFILE_DIR, ignore_errors=True)  # timings of the graph being replaced
        shutil.rmtree(out / SAMPLER_FOLDER, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def export_bundle(model: str | Path, out: str | Path, options: ExportOptions, progress: Progress | None = None):
    """Export a checkpoint into a bundle folder; returns the Manifest written there."""
    _require_extras()
    import onnx
    import onnxruntime
    import torch
    import transformers

    from ..version import __version__
    from .graph import build_graph
    from .validate import validate

    progress = progress or Progress()
    out = Path(out)
    with progress.stage(f"loading {model}"):
        ckpt: Checkpoint = open_checkpoint(model)
        spec = lookup(ckpt.config.model_type)
        arch = architecture_of(ckpt.config, spec)
    max_seq_len = options.max_seq_len or min(getattr(ckpt.config, "max_position_embeddings", 4096), 4096)
    _check_longrope(ckpt.config, max_seq_len)
    _prepare_out(out, ckpt.path, options.overwrite)
    try:
        source = Source(
            str(ckpt.path.resolve()),
            ckpt.format,
            ckpt.weights_sha256(progress),
            [f.name for f in ckpt.weight_files],
        )
        with progress.stage("writing tokenizer"):
            tokenizer = ckpt.save_tokenizer(out)
        if options.vocab_size is not None:
            arch = padded(arch, options.vocab_size, out / TOKENIZER_FILE)
        quant = options.quantization()
        with progress.stage(f"building the graph ({arch.num_layers} layers, {quant.method})"):
            graph, weights_sha256, native_log = build_graph(
                ckpt, spec, arch, max_seq_len, quant, out, progress, options.graph, options.masks, options.dtype
            )
        if native_log:
            quant = replace(quant, tensors=native_log)
        tensorrt = check_tensorrt(out / graph.model_file)
        manifest = Manifest(
            name=options.name or (ckpt.path.stem if ckpt.path.is_file() else ckpt.path.name),
            role=options.role,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            source=source,
            architecture=arch,
            max_seq_len=max_seq_len,
            dtype=options.dtype,
            quantization=quant,
            graph=graph,
            tensorrt=tensorrt,
            tokenizer=tokenizer,
            versions={
                "specrt": __version__,
                "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
        )
        if options.validate and options.dtype == "bf16":
            progress.log("bf16: not validated (ONNX Runtime's CPU provider has no bfloat16 kernels to run it)")
        elif options.validate:
            with progress.stage("validating against PyTorch"):
                v = validate(
                    ckpt, out, manifest, gated=quant.method == "none" and not quant.lm_head_bits, progress=progress
                )
            manifest = replace(manifest, validation=v)
        with progress.stage("writing the sampler graphs"):
            samplers = write_samplers(out)
        # Last: what each file is, so the runtime can tell a changed file from the exported one.
        files = [record(out, graph.model_file, "graph"), record(out, graph.data_file, "weights", weights_sha256)]
        kinds = {TOKENIZER_FILE: "tokenizer", tokenizer.chat_template: "chat_template"}
        files += [record(out, name, kinds[name]) for name in tokenizer.files]
        files += [record(out, name, "graph") for name in samplers]
        manifest = replace(manifest, files=files)
        manifest.write(out)
    except BaseException:
        (out / MANIFEST_FILE).unlink(missing_ok=True)
        raise
    return manifest


def _check_longrope(config, max_seq_len: int) -> None:
    """longrope (Phi-3 128k, Phi-4-mini) rotates by its short table while a sequence fits the original
    context and by its long table past it: one table is exact only when the KV buffer ends within it."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) != "longrope":
        return
    original = rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", 0)
    if max_seq_len > original:
        raise UnsupportedModelError(
            f"longrope switches to its long table past the original {original} positions (the whole sequence "
            f"changes tables then); export with --max-seq-len {original} or less"
        )


def padded(arch: Architecture, size: int, tokenizer: Path) -> Architecture:
    """The architecture with its vocabulary padded to `size` ids, once the tokenizer is shown never to produce
    the rows added (they are padding, not tokens that the model lacks)."""
    if size < arch.vocab_size:
        raise ExportError(f"--vocab-size {size} is below the model's own {arch.vocab_size} rows; pad, never cut")
    highest = max(id_tokens(tokenizer))
    if highest >= arch.vocab_size:
        raise ExportError(
            f"the tokenizer produces id {highest}, past the model's {arch.vocab_size} rows: those ids are tokens "
            "the model has no row for, not padding; --vocab-size cannot make this pair"
        )
    return replace(arch, vocab_size=size, padded_from=arch.vocab_size) if size > arch.vocab_size else arch


def open_checkpoint(path: str | Path) -> Checkpoint:
    p = Path(path)
    if not p.exists():
        raise ExportError(f"model path {p} does not exist")
    if p.is_file():
        if p.suffix == ".gguf":
            from .gguf import GGUFCheckpoint

            return GGUFCheckpoint(p)
        raise ExportError(f"{p} is a file; pass a Hugging Face model folder (config.json + weights) or .gguf")
    return HFCheckpoint(p)
