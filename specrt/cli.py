"""The `specrt` command line: wires export, generate, bench, profile and inspect to the library.

Known errors (any SpecrtError, bad options) print one line and exit with code 2; SPECRT_DEBUG=1 shows
the traceback instead. The exporter is imported only by `specrt export`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click

from .cli_options import DraftCount, PathType, engine_options, export_options, ray_options
from .errors import BundleError, OptionsError, SpecrtError
from .version import __version__


def _debug() -> bool:
    return os.environ.get("SPECRT_DEBUG", "") not in ("", "0")


def _load(kw: dict, max_batch: int = 1):
    from .engine.load import load

    drafts = kw.pop("drafts")
    paths = [d for d in drafts if d != "ngram"]
    if len(paths) > 1:
        raise OptionsError(f"--draft: at most one draft bundle, got {len(paths)}; add 'ngram' for prompt lookup")
    return load(
        kw.pop("target"),
        paths[0] if paths else None,
        threads=kw.pop("threads"),
        draft_threads=kw.pop("draft_threads"),
        device=kw.pop("device"),
        draft_device=kw.pop("draft_device"),
        tf32=kw.pop("tf32"),
        cuda_graphs=kw.pop("cuda_graphs"),
        spinning=kw.pop("spinning"),
        ngram="ngram" in drafts,
        max_batch=max_batch,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="specrt")
def cli() -> None:
    """Export LLMs to ONNX engine bundles and run lossless speculative decoding."""


@cli.command()
@export_options
def export(model, out, quiet, profile, **kw):
    """Export a checkpoint to an engine bundle (needs: pip install 'specrt[export]')."""
    from .export import ExportOptions, Progress, export_bundle

    options = ExportOptions.for_role(**kw, model_format="gguf" if model.suffix == ".gguf" else "hf-folder")
    out = out or Path("engines") / f"{model.name.removesuffix('.gguf')}-{options.quant_label}"
    progress = Progress(enabled=False if quiet else None)
    manifest = export_bundle(model, out, options, progress)
    if profile and manifest.dtype == "bf16":  # no CPU kernels to time it with
        progress.log("bf16: not profiled here (ONNX Runtime's CPU provider has no bfloat16 kernels)")
    elif profile:  # before the summary, so that it lists the profile
        _profile_bundle(out, progress.log)
    click.echo(f"bundle written to {out}")
    from .bundle.describe import describe

    click.echo(describe(out, manifest))


@cli.command()
@engine_options
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--prompt-file", type=PathType, default=None, help="Prompt file ('-': stdin).")
@click.option(
    "--prompt-encoding",
    default="utf-8",
    show_default=True,
    help="Text encoding of --prompt-file (any Python codec name, e.g. latin-1, utf-16).",
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
    type=DraftCount(),
    default="auto",
    show_default=True,
    help="Draft tokens per round: 'auto' lets the cost model choose (0 when speculation does not pay).",
)
@click.option("--max-draft-tokens", type=int, default=8, show_default=True, help="Largest k 'auto' may choose.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it is generated.")
@click.option("--stats", is_flag=True, help="Print speculation statistics to stderr.")
@click.option(
    "--compare",
    is_flag=True,
    help="Then time target-only and speculative decoding again, both warm, and print the speedup (stderr).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, token ids, stats).")
def generate(prompt, prompt_file, prompt_encoding, chat, system, stream, stats, compare, as_json, **kw):
    """Generate text with a target bundle, speculatively when a draft is given."""
    from .options import GenerationOptions
    from .prompts import read_prompt_file

    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("give exactly one of --prompt or --prompt-file")
    if compare and not kw["drafts"]:
        raise click.UsageError("--compare needs --draft (it compares speculative with target-only decoding)")
    text = prompt if prompt is not None else read_prompt_file(prompt_file, prompt_encoding)
    engine = _load(kw)
    options = GenerationOptions(**kw)
    gen = engine.generate(text, options, chat=chat, system=system)
    live = stream and not as_json
    for piece in gen:
        if live:
            click.echo(piece, nl=False)
    if as_json:
        out = {"text": gen.text, "token_ids": gen.token_ids, "finish_reason": gen.finish_reason}
        click.echo(json.dumps({**out, "stats": gen.stats.to_dict()}))
    else:
        click.echo(gen.text if not live else "")
    if stats:
        click.echo(gen.stats.summary(), err=True)
    if compare:
        from .bench import compare_with_target_only

        click.echo(compare_with_target_only(engine, text, options, gen, chat=chat, system=system), err=True)


@cli.command()
@engine_options
@click.option(
    "--prompts",
    "prompts_file",
    type=PathType,
    default=None,
    help='JSON lines {"name", "prompt", "chat", "kind"} [default: 8 built-in prompts].',
)
@click.option(
    "-k",
    "--num-draft-tokens",
    "ks",
    default="auto,2,4",
    show_default=True,
    help="Comma-separated k values ('auto' or integers) to compare with target-only decoding.",
)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs per configuration.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Short untimed runs first.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0: greedy (checks equality).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", type=PathType, default=None, help="Write results as JSON.")
def bench(prompts_file, ks, max_new_tokens, repeats, warmup, temperature, seed, json_out, **kw):
    """Benchmark target-only against speculative decoding on the same prompts."""
    from .bench import run_bench
    from .prompts import DEFAULT_PROMPTS, load_prompts

    k_values = [DraftCount().convert(k.strip(), None, None) for k in ks.split(",") if k.strip()]
    prompts = load_prompts(prompts_file) if prompts_file else list(DEFAULT_PROMPTS)
    engine = _load(kw)
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
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--max-batch", type=int, default=4, show_default=True, help="Requests running at once (KV slots).")
@click.option("--max-queue", type=int, default=64, show_default=True, help="Requests waiting; more get 429.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' [default: env SPECRT_API_KEY].")
@click.option("--model-name", default=None, help="The model's name in the API [default: the target bundle's name].")
@click.option("--max-tokens", type=int, default=256, show_default=True, help="Default max_tokens of a request.")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="Default temperature (OpenAI's).")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Default top_p.")
@click.option("--top-k", type=int, default=0, show_default=True, help="Default top_k (0: off).")
@click.option("-k", "--num-draft-tokens", type=DraftCount(), default="auto", show_default=True, help="Default k.")
@click.option("--drain-seconds", type=float, default=30.0, show_default=True, help="Grace for running requests.")
@ray_options
def serve(host, port, max_batch, max_queue, api_key, model_name, max_tokens, temperature, top_p, top_k, **kw):
    """An OpenAI-compatible HTTP server (needs: pip install 'specrt[serve]')."""
    try:
        from .serve.server import ServeConfig
        from .serve.server import serve as run
    except ImportError as e:
        raise OptionsError(
            f"specrt serve needs the [serve] extra ({e.name} is missing): pip install 'specrt[serve]'"
        ) from None
    from .bundle.loading import open_bundle
    from .options import GenerationOptions
    from .serve.protocol import Defaults

    k, drain = kw.pop("num_draft_tokens"), kw.pop("drain_seconds")
    # The defaults are checked now, not at the first request.
    GenerationOptions(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, num_draft_tokens=k)
    defaults = Defaults(max_tokens, temperature, top_p, top_k, k)
    if max_batch < 1 or max_queue < 0:
        raise OptionsError("--max-batch must be >= 1 and --max-queue >= 0")
    name = model_name or open_bundle(kw["target"]).name
    key = api_key or os.environ.get("SPECRT_API_KEY") or None
    config = ServeConfig(name, max_queue, key, defaults, drain)
    scale = {key: kw.pop(key) for key in ("ray", "replicas", "min_replicas", "router", "ray_address")}
    if scale.pop("ray"):
        return _serve_on_ray(kw, config, max_batch, host, port, scale)
    click.echo(f"specrt serve: {name} on http://{host}:{port}/v1 (max batch {max_batch}, queue {max_queue})", err=True)
    run(lambda: _load(dict(kw), max_batch=max_batch), config, host, port)


def _serve_on_ray(kw: dict, config, max_batch: int, host: str, port: int, scale: dict) -> None:
    try:
        from .scale.app import ScaleConfig, run
    except ImportError as e:
        raise OptionsError(
            f"specrt serve --ray needs the [ray] extra ({e.name} is missing): pip install 'specrt[ray]'"
        ) from None
    address = scale.pop("ray_address")
    c = ScaleConfig(
        str(kw["target"]), functools.partial(_load, dict(kw), max_batch=max_batch), config, max_batch, **scale
    )
    where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
    count = f"{c.min_replicas}..{c.replicas}" if c.min_replicas is not None else str(c.replicas)
    click.echo(
        f"specrt serve --ray: {config.model_name} on http://{host}:{port}/v1, {count} replicas of max batch "
        f"{max_batch} on {where}, {c.router} routing",
        err=True,
    )
    run(c, host, port, address)


@cli.command()
@click.argument("bundle", type=PathType)
@click.option("--threads", type=int, default=0, show_default=True, help="Intra-op threads (0: auto).")
@click.option(
    "--spinning/--no-spinning",
    default=True,
    show_default=True,
    help="Threads spin during each run and stop when it returns, as beside a draft model (the setting the "
    "cost model runs with); --no-spinning matches an engine loaded with --no-spinning.",
)
@click.option("--reps", type=int, default=3, show_default=True, help="Timed runs per point (median).")
@click.option("--save-busy", is_flag=True, help="Store it even if other processes held the CPUs while timing.")
def profile(bundle, threads, spinning, reps, save_busy):
    """Measure step time for 1..16 new tokens at several context lengths (and, for standard graphs, for batches
    of 1-8 rows); store it in the bundle."""
    _profile_bundle(bundle, lambda line: click.echo(line, err=True), threads, spinning, reps, save_busy)


def _profile_bundle(
    bundle: Path, log, threads: int = 0, spinning: bool = True, reps: int = 3, save_busy: bool = False
) -> None:
    from .bundle.loading import open_bundle
    from .runtime.session import ModelSession, SessionOptions
    from .tuning.measure import BATCHES, busy, measure, measure_batches, save_batch_profile, save_profile

    log(f"profiling {bundle} (step time for 1..16 new tokens at several context lengths) ...")
    options = SessionOptions(intra_op_threads=threads, allow_spinning=spinning, spin_between_runs=False)
    session = ModelSession(open_bundle(bundle), options)
    prof = measure(session, reps=reps)
    where = save_profile(bundle, prof, even_if_busy=save_busy)
    click.echo(prof.table())
    if busy(prof.others_share) and not save_busy:
        note = f"other processes took {prof.others_share:.0%} of the CPUs while timing (twice): not saved; rerun "
        return log(f"warning: {note}`specrt profile {bundle}` on a quiet machine, or add --save-busy if always busy")
    click.echo(f"saved to {where}" if where else "bundle folder is read-only: profile not saved")
    if session.graph.flavour != "standard":
        return
    # t(B, S) too: a server whose first requests arrive together reads it at once instead of measuring it
    # (minutes, while requests wait) when a request is next admitted alone.
    del session
    log(f"profiling batches of {', '.join(map(str, BATCHES))} rows ...")
    rows = ModelSession(open_bundle(bundle), options, rows=max(BATCHES))
    batches = measure_batches(rows, BATCHES)
    where = save_batch_profile(rows, batches, even_if_busy=save_busy)
    if where is None and busy(batches.others_share):
        return log(
            f"warning: other processes took {batches.others_share:.0%} of the CPUs while timing batches: not saved"
        )
    click.echo(f"batch profile saved to {where}" if where else "bundle folder is read-only: batch profile not saved")


@cli.command()
@click.argument("bundle", type=PathType)
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def inspect(bundle, as_json):
    """Show a bundle's manifest in readable form (file sizes and the small files' hashes are checked)."""
    from .bundle.describe import describe
    from .bundle.loading import open_bundle

    b = open_bundle(bundle)
    click.echo(json.dumps(b.manifest.to_dict(), indent=2) if as_json else describe(b.path, b.manifest))


@cli.command()
@click.argument("bundle", type=PathType)
def verify(bundle):
    """Check every file of a bundle against its manifest: sizes and SHA-256, weights included."""
    import time

    from .bundle.describe import human_size
    from .bundle.integrity import check_files
    from .bundle.loading import read_manifest

    folder, manifest = read_manifest(bundle)  # in range, every name inside the folder
    t0 = time.perf_counter()
    checks = check_files(folder, manifest.files, full=True, stop_at_first=False)
    total = time.perf_counter() - t0
    width = max(len(c.record.name) for c in checks)
    for c in checks:
        status = "ok" if c.ok else ("MISSING" if c.found_size is None else "MISMATCH")
        click.echo(
            f"{c.record.name:<{width}}  {c.record.kind:<13} {human_size(c.record.size):>10}  "
            f"sha256 {c.record.sha256[:16]}  {status}  ({c.seconds:.2f} s)"
        )
    bad = [c for c in checks if not c.ok]
    click.echo(
        f"{len(checks) - len(bad)} of {len(checks)} files match {folder / 'manifest.json'}, hashed in {total:.2f} s"
    )
    if bad:
        more = f" ({len(bad) - 1} more files differ)" if len(bad) > 1 else ""
        raise BundleError(bad[0].problem(folder) + more)


@cli.command()
@click.argument("bundle", type=PathType)
def upgrade(bundle):
    """Bring an older bundle's graphs up to date in place: the sampler graphs, and the model graph's own greedy
    pick (needs the [export] extra; the weights are untouched)."""
    from .export.upgrade import upgrade_bundle

    click.echo(upgrade_bundle(bundle))


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="specrt", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:  # bad flags and values: one line, like every other error
        hint = ""
        if isinstance(e, click.UsageError) and e.ctx is not None:
            hint = f" (see {e.ctx.command_path} --help)"
        click.echo(f"error: {e.format_message()}{hint}", err=True)
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
