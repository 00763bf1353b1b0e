"""The `specrt` command line: wires `export`, `generate` and `inspect` to the library, nothing more.

Known errors (any SpecrtError, bad options) print one line and exit with code 2; SPECRT_DEBUG=1 shows
the traceback instead. The exporter is imported only by `specrt export`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import __version__
from .errors import SpecrtError


def _debug() -> bool:
    return os.environ.get("SPECRT_DEBUG", "") not in ("", "0")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="specrt")
def cli() -> None:
    """Export LLMs to ONNX engine bundles and run lossless speculative decoding."""


@cli.command()
@click.option(
    "--model",
    "model",
    required=True,
    type=click.Path(path_type=Path),
    help="Hugging Face model folder (config.json, safetensors, tokenizer).",
)
@click.option("--role", type=click.Choice(["target", "draft"]), required=True, help="What the bundle is for.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Bundle folder to create [default: engines/<model>-<quant>].",
)
@click.option("--max-seq-len", type=int, default=None, help="KV buffer length [default: min(model max, 4096)].")
@click.option("--dtype", type=click.Choice(["fp32"]), default="fp32", show_default=True)
@click.option(
    "--quant",
    type=click.Choice(["none", "int8", "int4"]),
    default="none",
    show_default=True,
    help="Weight-only quantization of the linear layers (MatMulNBits).",
)
@click.option("--block-size", type=int, default=32, show_default=True, help="Quantization block size.")
@click.option(
    "--accuracy-level",
    type=int,
    default=4,
    show_default=True,
    help="MatMulNBits accuracy level (4: int8 compute, fastest on CPU; 0: fp32 compute).",
)
@click.option(
    "--quantize-lm-head/--no-quantize-lm-head",
    default=True,
    show_default=True,
    help="Quantize the LM head along with the other linear layers.",
)
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Compare the graph with the PyTorch model (loads a second full copy of the weights).",
)
@click.option("--name", default=None, help="Bundle name recorded in the manifest [default: model folder name].")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle in --out.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def export(
    model,
    role,
    out,
    max_seq_len,
    dtype,
    quant,
    block_size,
    accuracy_level,
    quantize_lm_head,
    validate,
    name,
    overwrite,
    quiet,
):
    """Export a checkpoint to an engine bundle (needs: pip install 'specrt[export]')."""
    from .export import ExportOptions, Progress, export_bundle

    options = ExportOptions(
        role=role,
        max_seq_len=max_seq_len,
        dtype=dtype,
        quant=quant,
        block_size=block_size,
        accuracy_level=accuracy_level,
        quantize_lm_head=quantize_lm_head,
        validate=validate,
        name=name,
        overwrite=overwrite,
    )
    out = out or Path("engines") / f"{model.name.removesuffix('.gguf')}-{quant if quant != 'none' else dtype}"
    manifest = export_bundle(model, out, options, Progress(enabled=False if quiet else None))
    click.echo(f"bundle written to {out}")
    click.echo(_describe(out, manifest))


@cli.command()
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target bundle folder.")
@click.option(
    "--draft",
    type=click.Path(path_type=Path),
    default=None,
    help="Draft bundle folder; without it, plain target-only decoding.",
)
@click.option("--prompt", default=None, help="Prompt text.")
@click.option(
    "--prompt-file",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Read the prompt from a file ('-' for stdin).",
)
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user turn with the bundle's chat template.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables top-k.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 disables top-p.")
@click.option("--seed", type=int, default=None, help="Seed for sampling (reproducible runs).")
@click.option(
    "-k",
    "--num-draft-tokens",
    type=int,
    default=4,
    show_default=True,
    help="Tokens the draft proposes per round (0: speculation off).",
)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it is generated.")
@click.option("--stats", is_flag=True, help="Print speculation statistics to stderr.")
@click.option("--compare", is_flag=True, help="Also run target-only decoding and print the speedup (stderr).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, token ids, stats).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=0, show_default=True, help="Target intra-op threads (0: auto).")
@click.option("--draft-threads", type=int, default=None, help="Draft intra-op threads [default: --threads].")
def generate(
    target,
    draft,
    prompt,
    prompt_file,
    chat,
    system,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    seed,
    num_draft_tokens,
    stop,
    ignore_eos,
    stream,
    stats,
    compare,
    as_json,
    device,
    threads,
    draft_threads,
):
    """Generate text with a target bundle, speculatively when a draft is given."""
    from .api import load
    from .options import GenerationOptions

    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("give exactly one of --prompt or --prompt-file")
    text = prompt if prompt is not None else prompt_file.read()
    options = GenerationOptions(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        num_draft_tokens=num_draft_tokens,
        stop=stop,
        ignore_eos=ignore_eos,
    )
    if compare and draft is None:
        raise click.UsageError("--compare needs --draft (it compares speculative with target-only decoding)")
    engine = load(target, draft, threads=threads, draft_threads=draft_threads, device=device)
    gen = engine.generate(text, options, chat=chat, system=system)
    live = stream and not as_json
    for piece in gen:
        if live:
            click.echo(piece, nl=False)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "text": gen.text,
                    "token_ids": gen.token_ids,
                    "finish_reason": gen.finish_reason,
                    "stats": gen.stats.to_dict(),
                }
            )
        )
    else:
        click.echo(gen.text if not live else "")
    if stats:
        click.echo(gen.stats.summary(), err=True)
    if compare:
        _compare_with_target_only(engine, text, options, chat, system, gen)


def _compare_with_target_only(engine, text, options, chat, system, spec) -> None:
    """Rerun the same prompt without the draft, from a cold cache as the first run was, and report."""
    from dataclasses import replace

    engine.reset()
    base = engine.complete(text, replace(options, num_draft_tokens=0), chat=chat, system=system)
    fast, slow = spec.stats.new_tokens / spec.stats.total_s, base.stats.new_tokens / base.stats.total_s
    same = "identical" if spec.token_ids == base.token_ids else "different (expected only when sampling)"
    click.echo(
        f"speculative {fast:.2f} tok/s vs target-only {slow:.2f} tok/s: {fast / slow:.2f}x speedup; outputs {same}",
        err=True,
    )


@cli.command()
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target bundle folder.")
@click.option("--draft", type=click.Path(path_type=Path), default=None, help="Draft bundle folder.")
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(path_type=Path),
    default=None,
    help='JSON lines {"name", "prompt", "chat", "kind"} [default: 8 built-in prompts].',
)
@click.option(
    "-k",
    "--num-draft-tokens",
    "ks",
    default="2,4",
    show_default=True,
    help="Comma-separated k values to compare with target-only decoding.",
)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs per configuration.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed runs first.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0: greedy (checks equality).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Write results as JSON.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=0, show_default=True, help="Target intra-op threads (0: auto).")
@click.option("--draft-threads", type=int, default=None, help="Draft intra-op threads [default: --threads].")
def bench(
    target,
    draft,
    prompts_file,
    ks,
    max_new_tokens,
    repeats,
    warmup,
    temperature,
    seed,
    json_out,
    device,
    threads,
    draft_threads,
):
    """Benchmark target-only against speculative decoding on the same prompts."""
    from .api import load
    from .bench import DEFAULT_PROMPTS, load_prompts, run_bench
    from .errors import OptionsError

    try:
        k_values = [int(k) for k in ks.split(",") if k.strip()]
    except ValueError:
        raise OptionsError(f"--num-draft-tokens {ks!r}: expected comma-separated integers such as 2,4") from None
    prompts = load_prompts(prompts_file) if prompts_file else list(DEFAULT_PROMPTS)
    engine = load(target, draft, threads=threads, draft_threads=draft_threads, device=device)
    result = run_bench(
        engine,
        prompts,
        k_values,
        max_new_tokens,
        repeats,
        warmup,
        temperature,
        seed,
        log=lambda line: click.echo(line, err=True),
    )
    click.echo(result.markdown())
    if json_out:
        json_out.write_text(result.to_json())
        click.echo(f"results written to {json_out}", err=True)


@cli.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def inspect(bundle, as_json):
    """Show a bundle's manifest in readable form."""
    from .bundle import open_bundle

    b = open_bundle(bundle)
    click.echo(json.dumps(b.manifest.to_dict(), indent=2) if as_json else _describe(b.path, b.manifest))


def _describe(path: Path, m) -> str:
    a, q = m.architecture, m.quantization
    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    quant = (
        "none"
        if q.method == "none"
        else (
            f"{q.method} (MatMulNBits, block {q.block_size}, accuracy level {q.accuracy_level}, "
            f"LM head {'quantized' if q.lm_head else 'fp32'})"
        )
    )
    lines = [
        f"bundle        {path}  ({size / 2**20:.1f} MiB)",
        f"name / role   {m.name} / {m.role}   (schema {m.schema_version}, created {m.created})",
        f"architecture  {a.model_type}: {a.num_layers} layers, hidden {a.hidden_size}, heads {a.num_heads}/"
        f"{a.num_kv_heads} kv, head_dim {a.head_dim}, vocab {a.vocab_size}",
        f"max_seq_len   {m.max_seq_len}   dtype {m.dtype}   quantization {quant}",
        f"tokenizer     {m.tokenizer.sha256[:16]}  eos {m.tokenizer.eos_token_ids}  "
        f"chat template {'yes' if m.tokenizer.chat_template else 'no'}",
        f"source        {m.source.path} ({m.source.format}, sha256 {m.source.weights_sha256[:16]})",
        "versions      " + ", ".join(f"{k} {v}" for k, v in m.versions.items()),
    ]
    v = m.validation
    if v is None:
        lines.append("validation    not run (exported with --no-validate)")
    else:
        gate = f"relative tolerance {v.tolerance:g}, passed" if v.tolerance is not None else "not gated (quantized)"
        lines.append(
            f"validation    vs {v.reference}: max |diff| {v.max_abs_diff:.3g}, "
            f"top-1 agreement {v.top1_agreement:.3f} ({gate})"
        )
        for s in v.steps:
            lines.append(f"  {s.name:<16} max |diff| {s.max_abs_diff:.3g}  top-1 {s.top1_agreement:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="specrt", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2)
    except SpecrtError as e:
        if _debug():
            raise
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
