"""The command line's shared option sets: the engine options of every command that runs bundles, and the
export options (kept here so that cli.py holds the commands)."""

from __future__ import annotations

from pathlib import Path

import click

PathType = click.Path(path_type=Path)


class DraftCount(click.ParamType):
    """`auto` (the cost model picks k each round) or an integer."""

    name = "auto|N"

    def convert(self, value, param, ctx):
        if value is None or value == "auto" or isinstance(value, int):
            return None if value in (None, "auto") else value
        if not value.lstrip("-").isdigit():
            self.fail(f"{value!r} is not 'auto' or an integer", param, ctx)
        return int(value)


def engine_options(f):
    """Options shared by every command that runs bundles."""
    for decorator in reversed(
        [
            click.option("--target", required=True, type=PathType, help="Target bundle folder."),
            click.option(
                "--draft",
                "drafts",
                multiple=True,
                help="Draft bundle folder, or 'ngram' for prompt lookup; repeat to combine (auto k: the drafter "
                "promising more drafts each round; fixed k: n-gram first).",
            ),
            click.option(
                "--device",
                default="cpu",
                show_default=True,
                help="cpu, cuda[:N], or tensorrt[:N] (a TensorRT-ready bundle: specrt inspect says).",
            ),
            click.option(
                "--draft-device",
                default=None,
                help="Run the draft apart, on this device (cpu, cuda[:N], tensorrt[:N]): the models exchange token ids "
                "(and a sampled verification the drafts' q) [default: --device, shared].",
            ),
            click.option(
                "--cuda-graphs",
                is_flag=True,
                help="Replay decode and verify runs as CUDA graphs (--device cuda; a few padded shapes).",
            ),
            click.option(
                "--tf32",
                is_flag=True,
                help="Let a GPU use TF32 in float32 MatMuls (faster; output may part from target-only decoding).",
            ),
            click.option("--threads", type=int, default=0, show_default=True, help="Target threads (0: auto)."),
            click.option("--draft-threads", type=int, default=None, help="Draft threads [default: --threads]."),
            click.option(
                "--spinning/--no-spinning",
                default=True,
                show_default=True,
                help="ONNX Runtime threads spin while a run waits for work (with a draft model loaded they stop "
                "when each run returns, leaving the cores to the other model).",
            ),
        ]
    ):
        f = decorator(f)
    return f


def export_options(f):
    """The options of `specrt export`."""
    for decorator in reversed(
        [
            click.option("--model", required=True, type=PathType, help="Hugging Face model folder or .gguf file."),
            click.option(
                "--role", type=click.Choice(["target", "draft"]), required=True, help="What the bundle is for."
            ),
            click.option(
                "--out", type=PathType, default=None, help="Bundle folder [default: engines/<model>-<quant>]."
            ),
            click.option(
                "--max-seq-len", type=int, default=None, help="KV buffer length [default: min(model max, 4096)]."
            ),
            click.option(
                "--vocab-size",
                type=int,
                default=None,
                help="Pad the vocabulary to N ids (a draft for a target whose vocabulary has more padding rows, "
                "e.g. Qwen2.5 0.5B's 151,936 to 7B's 152,064): the extra ids get probability 0.",
            ),
            click.option(
                "--dtype",
                type=click.Choice(["fp32", "fp16", "bf16"]),
                default="fp32",
                show_default=True,
                help="Activations, KV buffers and float weights (the final norm, LM head and logits stay float32).",
            ),
            click.option(
                "--quant",
                type=click.Choice(["none", "int8", "int4", "native"]),
                default=None,
                help="Weight-only quantization of the linear layers (MatMulNBits); native: a GGUF file's own quantized "
                "weights, not re-quantized [default: by role, see README].",
            ),
            click.option(
                "--graph",
                type=click.Choice(["standard", "gqa"]),
                default="standard",
                show_default=True,
                help="standard: ai.onnx operators, any batch (TensorScatter + Attention with a mask); gqa: "
                "com.microsoft.GroupQueryAttention, batch 1 (a 0.5B step ~5% faster, docs/graph-flavours.md).",
            ),
            click.option(
                "--weights",
                type=click.Choice(["nbits", "qdq"]),
                default=None,
                help="Quantized weights as standard DequantizeLinear + MatMul (qdq: ONNX Runtime fuses them "
                "into MatMulNBits, same speed) or as com.microsoft.MatMulNBits (nbits) [default: qdq for the "
                "standard graph, nbits for gqa].",
            ),
            click.option("--block-size", type=int, default=None, help="Quantization block size [default: by quant]."),
            click.option(
                "--accuracy-level", type=int, default=None, help="MatMulNBits accuracy level [default: by quant]."
            ),
            click.option(
                "--lm-head",
                type=click.Choice(["quantized", "int8", "int4", "fp32"]),
                default=None,
                help="LM head precision: as the body (quantized), its own bit width, or fp32 [default: quantized].",
            ),
            click.option(
                "--symmetric/--asymmetric",
                default=True,
                show_default=True,
                help="int4/int8: symmetric blocks, or a zero point per block.",
            ),
            click.option(
                "--validate/--no-validate", default=True, show_default=True, help="Compare with PyTorch (2x memory)."
            ),
            click.option(
                "--profile/--no-profile", default=True, show_default=True, help="Measure the verify-cost profile."
            ),
            click.option(
                "--name", default=None, help="Bundle name in the manifest [default: model file or folder name]."
            ),
            click.option("--overwrite", is_flag=True, help="Replace an existing bundle in --out."),
            click.option("--quiet", is_flag=True, help="No progress output."),
        ]
    ):
        f = decorator(f)
    return f


def ray_options(f):
    """`specrt serve --ray`: the engine as replicas on Ray Serve (specrt/scale/)."""
    for decorator in reversed(
        [
            click.option("--ray", "ray", is_flag=True, help="Serve through Ray Serve replicas (needs specrt[ray])."),
            click.option("--replicas", type=int, default=1, show_default=True, help="Engine replicas (--ray)."),
            click.option(
                "--min-replicas",
                type=int,
                default=None,
                help="Autoscale between this and --replicas, targeting --max-batch requests per replica (--ray).",
            ),
            click.option(
                "--router",
                type=click.Choice(["affinity", "pow2"]),
                default="affinity",
                show_default=True,
                help="affinity: a prompt goes to the replica caching its prefix; pow2: Ray Serve's default (--ray).",
            ),
            click.option(
                "--ray-address", default=None, help="An existing Ray cluster (e.g. auto) [default: start a local one]."
            ),
        ]
    ):
        f = decorator(f)
    return f
