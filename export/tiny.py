"""Tiny random checkpoints made from configs (no hub access): for tests, demos and bug reports.

Every checkpoint is a real Hugging Face folder (config.json, model.safetensors, tokenizer files), so the
exporter and the PyTorch reference read it exactly as they would read a downloaded model. Needs the
`[export]` extra (torch, transformers).
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding keeps the output unchanged.",
    "import numpy as np\nx = np.arange(10)\nprint(x.sum())\nfor i in range(3):\n    print(i)\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u65e5\u672c\u8a9e \U0001f600 emoji and unicode text.",
]

ARCH_CONFIGS = {
    "llama": dict(attention_bias=False),
    "mistral": dict(sliding_window=24),  # smaller than the test sequences: exercises the window
    "qwen2": dict(),
    "qwen3": dict(head_dim=32, attention_bias=False),  # head_dim != hidden / heads
    # Granite 3.x's four scalings, away from 1 (its real ones: 12, 1/128, 0.22, 8 for the 2B)
    "phi3": dict(sliding_window=24),  # Phi-3 mini's window (2,047) is every layer's
    "olmo2": dict(attention_bias=True),  # its q/k norms then normalise the biased projections
    "granite": dict(embedding_multiplier=3.0, attention_multiplier=0.09, residual_multiplier=0.5, logits_scaling=2.5),
    # Gemma: head_dim != hidden / heads, a query scalar away from head_dim, sliding (window 24 < the test
    # sequences) and full layers interleaved, soft caps small enough to bend the logits (the real ones: 50, 30)
    "gemma2": dict(
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=24,
        layer_types=["sliding_attention", "full_attention"],
        attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0,
    ),
    # Gemma 3: local layers rotate by base 10,000, global ones by their own base with linear scaling (4B+)
    "gemma3_text": dict(
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=24,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        final_logit_softcapping=2.0,
    ),
}


def make_tokenizer(out: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE trained on a few lines (or a word-level one for tiny vocabularies)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 64:
        words = [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIALS + words)}, unk_token=SPECIALS[0]))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="##")  # joins with spaces
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


def make_checkpoint(
    out: Path,
    tokenizer: Path,
    model_type: str = "llama",
    *,
    vocab_size: int = 320,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    init_range: float = 0.1,
    noise_from: Path | None = None,
    noise: float = 0.0,
    tie: bool = False,
    **extra,
) -> Path:
    """Save a random model (or `noise_from` plus Gaussian noise) into `out`, with the tokenizer files
    copied from the folder `tokenizer` (made by `make_tokenizer`), so that models can share one."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer.iterdir():
        shutil.copy(f, out / f.name)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    if noise_from is not None:
        model = AutoModelForCausalLM.from_pretrained(noise_from, dtype=torch.float32)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    else:
        kw = dict(ARCH_CONFIGS.get(model_type, {}))
        kw.update(extra)
        config = AutoConfig.for_model(
            model_type,
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=512,
            initializer_range=init_range,
            rms_norm_eps=1e-6,
            tie_word_embeddings=tie,
            eos_token_id=eos,
            pad_token_id=pad,
            bos_token_id=None,
            **kw,
        )
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        unit = 0.0 if model_type.startswith("gemma") else 1.0  # Gemma's norms multiply by (1 + weight)
        with torch.no_grad():  # random norms and biases, so their wiring is tested too
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(unit + 0.2 * torch.randn(p.shape))
                elif name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape))
    model.eval().save_pretrained(out)
    return out


def write_gguf(hf_folder: Path, out_file: Path, quant: str = "Q8_0") -> Path:
    """Convert a small Hugging Face llama/qwen2/phi3/gemma2/gemma3 checkpoint to GGUF the way llama.cpp's
    converter does.

    2-D weights are stored as `quant` (Q8_0 by default), norms and biases as F32; llama q/k rows are
    permuted into llama.cpp's rotary layout; Gemma's norms are stored as (1 + weight), the factor they
    multiply by; the tokenizer goes in as GGUF `gpt2` BPE metadata.
    """
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(hf_folder)
    arch = {"gemma3_text": "gemma3"}.get(cfg.model_type, cfg.model_type)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    qtype = gguf.GGMLQuantizationType[quant]

    writer = gguf.GGUFWriter(str(out_file), arch)
    writer.add_name(hf_folder.name)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)  # Gemma 3: the global layers' base
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim != cfg.hidden_size // cfg.num_attention_heads or arch.startswith("gemma"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch.startswith("gemma") and getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)

    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tok["added_tokens"] if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_pad_token_id(cfg.pad_token_id)
    writer.add_add_bos_token(False)
    template = hf_folder / "chat_template.jinja"
    if template.exists():
        writer.add_chat_template(template.read_text())

    def permute(w: np.ndarray, heads: int) -> np.ndarray:  # llama.cpp's convert_hf_to_gguf permute
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    for hf_name, w in load_file(hf_folder / "model.safetensors").items():
        base, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(base) + "." + suffix
        w = w.astype(np.float32)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            w = w + 1.0  # llama.cpp's converter: ggml's RMSNorm multiplies by the stored weight
        if arch == "llama" and base.endswith("q_proj") and suffix == "weight":
            w = permute(w, cfg.num_attention_heads)
        if arch == "llama" and base.endswith("k_proj") and suffix == "weight":
            w = permute(w, cfg.num_key_value_heads)
        if w.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_file
