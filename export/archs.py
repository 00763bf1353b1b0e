"""Supported architectures: a registry keyed by the Hugging Face `model_type`.

Each entry says how a decoder-only Llama-family model differs from plain Llama: which projections carry
biases, whether q/k get a per-head RMSNorm, where the norms sit, the activation, the scalings and soft caps,
which layers use sliding-window attention, and where its rotary embedding lives in transformers. Adding an
architecture is one `register(...)` call here, plus a tiny config in the tests. The graph builder reads
nothing model-specific from anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedModelError

Config = Any  # a transformers PretrainedConfig


def _attention_bias(config: Config) -> frozenset[str]:
    return frozenset({"q", "k", "v", "o"}) if getattr(config, "attention_bias", False) else frozenset()


def _every_layer_window(config: Config, layer: int) -> int | None:
    return getattr(config, "sliding_window", None)  # every layer's, when set (Mistral, Phi-3)


def _llama_biases(config: Config) -> frozenset[str]:
    """attention_bias on q k v o, mlp_bias on gate up down (Llama's and Granite's two switches)."""
    mlp = frozenset({"gate", "up", "down"}) if getattr(config, "mlp_bias", False) else frozenset()
    return _attention_bias(config) | mlp


def _window_from_layer_types(config: Config, layer: int) -> int | None:
    layer_types = getattr(config, "layer_types", None)
    if layer_types and layer_types[layer] == "sliding_attention":
        return config.sliding_window
    return None


@dataclass(frozen=True)
class ArchSpec:
    model_type: str
    rotary: str  # dotted path of the transformers rotary-embedding class (cos/sin exactly as HF computes)
    biases: Callable[[Config], frozenset[str]] = _attention_bias  # projections with a bias: q k v o gate up down
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    qk_norm_full: bool = False  # RMSNorm over all of q's heads at once, and of k's, before RoPE (OLMo 2)
    pre_norms: bool = True  # RMSNorm on each block's input (all but OLMo 2)
    post_norms: bool = False  # RMSNorm on each block's output before the residual (OLMo 2, Gemma 2/3)
    norm_offset: float = 0.0  # Gemma: every RMSNorm multiplies by (1 + weight), its checkpoints store weight
    fused: bool = False  # the checkpoint holds qkv_proj and gate_up_proj, already fused (Phi-3)
    window: Callable[[Config, int], int | None] = _window_from_layer_types  # sliding window of layer i
    activation: Callable[[Config], str] = lambda c: getattr(c, "hidden_act", "silu")  # the MLP gate's
    hidden_acts: tuple[str, ...] = ("silu",)  # the activations the graph builds ("gelu_pytorch_tanh": Gemma)
    rope_per_layer_type: bool = False  # Gemma 3: sliding and full layers rotate by their own tables
    # Granite's scalings (1.0 / None: none): the embeddings times embedding_multiplier, the attention logits
    # times attention_scale (None: head_dim ** -0.5), each block's output times residual_multiplier before
    # it joins the residual stream, the final logits divided by logits_divisor.
    embedding_multiplier: Callable[[Config], float] = lambda c: 1.0
    attention_scale: Callable[[Config], float | None] = lambda c: None
    residual_multiplier: Callable[[Config], float] = lambda c: 1.0
    logits_divisor: Callable[[Config], float] = lambda c: 1.0
    # Gemma's soft caps (None: none): cap * tanh(x / cap) on the attention logits (Gemma 2; before the mask)
    # and on the final logits (Gemma 2, and Gemma 3 where its config sets one).
    attention_softcap: Callable[[Config], float | None] = lambda c: None
    logits_softcap: Callable[[Config], float | None] = lambda c: None


REGISTRY: dict[str, ArchSpec] = {}


def register(spec: ArchSpec) -> ArchSpec:
    REGISTRY[spec.model_type] = spec
    return spec


def lookup(model_type: str) -> ArchSpec:
    spec = REGISTRY.get(model_type)
    if spec is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(REGISTRY))}"
        )
    return spec


register(
    ArchSpec(
        "llama",
        rotary="transformers.models.llama.modeling_llama.LlamaRotaryEmbedding",
        biases=_llama_biases,
    )
)
register(
    ArchSpec(
        "mistral",
        rotary="transformers.models.mistral.modeling_mistral.MistralRotaryEmbedding",
        biases=lambda c: frozenset(),
        window=_every_layer_window,
    )
)
register(
    ArchSpec(
        "qwen2",
        rotary="transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding",
        biases=lambda c: frozenset({"q", "k", "v"}),
    )
)
register(
    ArchSpec(
        "qwen3",
        rotary="transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding",
        qk_norm=True,
    )
)
register(
    ArchSpec(
        "granite",
        rotary="transformers.models.granite.modeling_granite.GraniteRotaryEmbedding",
        biases=_llama_biases,
        embedding_multiplier=lambda c: float(c.embedding_multiplier),
        attention_scale=lambda c: float(c.attention_multiplier),
        residual_multiplier=lambda c: float(c.residual_multiplier),
        logits_divisor=lambda c: float(c.logits_scaling),
    )
)
register(
    ArchSpec(
        "olmo2",
        rotary="transformers.models.olmo2.modeling_olmo2.Olmo2RotaryEmbedding",
        qk_norm_full=True,
        pre_norms=False,
        post_norms=True,
    )
)
register(
    ArchSpec(
        "phi3",
        rotary="transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding",
        biases=lambda c: frozenset(),
        window=_every_layer_window,
        fused=True,
    )
)


def _gemma(model_type: str, rotary: str, **differences) -> ArchSpec:
    """Gemma 2 and 3: (1 + w) norms before and after each block, a GELU-tanh MLP, the embeddings times
    sqrt(hidden), queries scaled by query_pre_attn_scalar ** -0.5, sliding and full layers interleaved."""
    return ArchSpec(
        model_type,
        rotary=rotary,
        post_norms=True,
        norm_offset=1.0,
        activation=lambda c: c.hidden_activation,
        hidden_acts=("gelu_pytorch_tanh",),
        embedding_multiplier=lambda c: float(c.hidden_size**0.5),
        attention_scale=lambda c: float(c.query_pre_attn_scalar) ** -0.5,
        logits_softcap=lambda c: c.final_logit_softcapping,
        **differences,
    )


register(
    _gemma(
        "gemma2",
        "transformers.models.gemma2.modeling_gemma2.Gemma2RotaryEmbedding",
        attention_softcap=lambda c: c.attn_logit_softcapping,
    )
)
# Gemma 3's config carries attn_logit_softcapping, but its attention (transformers) applies none.
register(
    _gemma(
        "gemma3_text",
        "transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding",
        qk_norm=True,
        rope_per_layer_type=True,
    )
)
