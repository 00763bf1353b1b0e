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
}


def make_tokenizer(out: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE trained on a few lines (or a word-level one for tiny vocabularies)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 64:
        words = [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
        tok = Tokenizer(
            models.WordLevel({w: i for i, w in enumerate(SPECIALS + words)}, unk_token=SPECIALS[0])
        )
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
        with torch.no_grad():  # random norms and biases, so their wiring is tested too
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape))
                elif name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape))
    model.eval().save_pretrained(out)
    return out
