"""The generate loop and its surfaces: stopping, streaming, stop strings, cache reuse, CLI and API."""

from __future__ import annotations

import json

import pytest

import specrt
from specrt import GenerationOptions
from specrt.cli import main


@pytest.fixture(scope="module")
def engine(zoo):
    return specrt.load(zoo.target(), zoo.noisy_draft())


@pytest.fixture(scope="module")
def short(zoo):
    """Bundles with short KV buffers: target 64 positions, draft only 48."""
    zoo.target()
    zoo.noisy_draft()
    target = zoo.bundle("target-64", "target", max_seq_len=64)
    draft = zoo.bundle("noisy-48", "noisy", max_seq_len=48, role="draft")
    return specrt.load(target, draft)


@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_reaching_max_seq_len_stops_cleanly(short, k):
    prompt = "def fibonacci(n):\n    if n < 2:"
    options = GenerationOptions(max_new_tokens=1000, num_draft_tokens=k, ignore_eos=True)
    gen = short.complete(prompt, options)
    assert gen.finish_reason == "length"
    assert len(gen.prompt_ids) + len(gen.token_ids) == 64
    assert short.target.kv.rows[0].length <= 64 and short.draft.kv.rows[0].length <= 48
    base = short.complete(prompt, GenerationOptions(max_new_tokens=1000, num_draft_tokens=0, ignore_eos=True))
    assert gen.token_ids == base.token_ids
    if k:
        # Past 48 tokens the draft has no room: those rounds fall back to k = 0 instead of overflowing.
        assert gen.stats.k_histogram[0] > 0 and gen.stats.drafted > 0


def test_prompt_that_nearly_fills_the_buffer(short):
    ids = short.encode("print(x.sum()) " * 40)[:63]
    gen = short.complete(ids, GenerationOptions(max_new_tokens=10, ignore_eos=True))
    assert gen.token_ids and len(gen.token_ids) == 1 and gen.finish_reason == "length"


def test_streamed_text_equals_final_text(engine):
    gen = engine.generate("import numpy as np\n", GenerationOptions(max_new_tokens=48, ignore_eos=True))
    pieces = list(gen)
    assert len(pieces) > 1
    assert "".join(pieces) == gen.text == engine.tokenizer.decode(gen.token_ids)


def test_stop_strings_cut_text_and_never_leak(engine):
    prompt = "for i in range(3):\n"
    full = engine.complete(prompt, GenerationOptions(max_new_tokens=48, ignore_eos=True)).text
    # A 2-character stop string whose first occurrence is well inside the text.
    start = next(i for i in range(5, len(full) - 2) if full.index(full[i : i + 2]) == i)
    stop = full[start : start + 2]
    gen = engine.generate(prompt, GenerationOptions(max_new_tokens=48, ignore_eos=True, stop=(stop, "\x00never")))
    streamed = "".join(gen)
    assert gen.finish_reason == "stop"
    assert streamed == gen.text == full[: full.index(stop)]


def test_max_new_tokens_is_exact(engine):
    for k in (0, 4, 8):
        gen = engine.complete("a", GenerationOptions(max_new_tokens=7, num_draft_tokens=k, ignore_eos=True))
        assert len(gen.token_ids) == 7 and gen.finish_reason == "max_new_tokens"


def test_cache_reuse_and_cancellation(engine):
    # A fixed k: with auto k, an engine whose live timings prove its profile wrong re-measures it in the
    # idle moment after a request, in the slot holding the shortest cached prefix (here the only one).
    options = GenerationOptions(max_new_tokens=32, num_draft_tokens=2, ignore_eos=True)
    first = engine.complete("The quick brown fox", options)
    assert engine.target.kv.rows[0].ids == (first.prompt_ids + first.token_ids)[:-1]
    assert engine.draft.kv.rows[0].ids == (first.prompt_ids + first.token_ids)[: engine.draft.kv.rows[0].length]
    again = engine.complete("The quick brown fox", options)
    assert again.token_ids == first.token_ids
    assert again.stats.prefill_s <= first.stats.prefill_s * 5  # prefill fed one token, not the prompt
    gen = engine.generate("The quick brown fox jumps", options)
    for _ in gen:
        break
    assert gen.finish_reason == "cancelled"
    other = engine.complete("The quick", options)
    fresh = specrt.load(engine.target.bundle.path, engine.draft.bundle.path).complete("The quick", options)
    assert other.token_ids == fresh.token_ids


def test_profile_measurement_at_admission_is_not_decode_time(zoo):
    """The first auto-k request may measure cost profiles before its prefill: that time is reported apart
    (setup_s), not as decode time or time outside ONNX Runtime."""
    import time

    engine = specrt.load(zoo.target(), zoo.noisy_draft())
    prepare = engine.scheduler.prepare
    engine.scheduler.prepare = lambda r: (time.sleep(0.5), prepare(r))[1]  # as long as a real measurement
    gen = engine.complete("def f(x):", GenerationOptions(max_new_tokens=20, ignore_eos=True))
    s = gen.stats
    assert s.setup_s >= 0.5 and s.total_s >= s.setup_s + s.prefill_s
    assert s.decode_s <= s.total_s - 0.5 and s.overhead_ms_per_round < 500 / (s.rounds + 1)
    assert "measuring cost profiles" in s.summary() and s.to_dict()["setup_s"] >= 0.5


def test_the_sampler_graphs_runs_count_as_runtime(zoo):
    """A sampled round's verification runs a sampler graph beside the target pass: inside ONNX Runtime, so
    in runtime_s (not in the time outside ONNX Runtime); the numpy path's verification is outside it."""
    target, draft = zoo.target(), zoo.noisy_draft()
    options = GenerationOptions(max_new_tokens=30, num_draft_tokens=3, temperature=0.8, seed=1, ignore_eos=True)
    beside = {}
    for path in ("graph", "host"):
        s = specrt.load(target, draft, sampler=path).complete("def f(x):", options).stats
        beside[path] = s.runtime_s - s.prefill_s - s.draft_s - s.target_s  # the decisions' runs, per round
    assert beside["graph"] > 2e-4 and abs(beside["host"]) < 1e-4, beside  # host: two clock reads apart (us)


EXIT_MIDWAY = """
import sys, specrt
engine = specrt.load(sys.argv[1], sys.argv[2])
options = specrt.GenerationOptions(max_new_tokens=100_000, num_draft_tokens=3, ignore_eos=True)
gens = [engine.generate([3, 5, 7], options) for _ in range(2)]
next(iter(gens[0]))
print("leaving with generations running", flush=True)
"""


def test_exit_while_generating_is_clean(zoo):
    """A program that ends while its generations still run exits normally: the scheduler thread stops after
    its round instead of running ONNX Runtime while the interpreter tears down (which aborts the process)."""
    import subprocess
    import sys

    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_MIDWAY, str(zoo.target()), str(zoo.noisy_draft())],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0 and "leaving" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_chat_template(engine):
    ids = engine.encode("hello", chat=True)
    text = engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    gen = engine.complete("hello", GenerationOptions(max_new_tokens=8), chat=True)
    assert gen.prompt_ids == ids


def test_stats_are_consistent(engine):
    gen = engine.complete(
        "x = np.arange(10)", GenerationOptions(max_new_tokens=40, num_draft_tokens=4, ignore_eos=True)
    )
    s = gen.stats
    assert s.new_tokens == 40 == 1 + s.rounds + s.accepted
    assert sum(s.k_histogram.values()) == s.rounds
    assert s.drafted == sum(k * n for k, n in s.k_histogram.items())
    assert 0 < s.acceptance_rate < 1 and 1 < s.tokens_per_target_pass <= 5
    assert s.total_s >= s.prefill_s and s.tokens_per_s > 0
    assert json.loads(json.dumps(s.to_dict()))["drafted"] == s.drafted
    assert "drafted" in s.summary()


def test_cli_generate_stream_json_and_stats(capsys, zoo, tmp_path):
    target, draft = zoo.target(), zoo.noisy_draft()
    base = ["generate", "--target", str(target), "--max-new-tokens", "20", "--ignore-eos"]
    main_ok(base + ["--draft", str(draft), "--prompt", "def f(x):", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 20 and out["finish_reason"] == "max_new_tokens"
    (tmp_path / "p.txt").write_text("def f(x):")
    main_ok(base + ["--prompt-file", str(tmp_path / "p.txt"), "--stats"])
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == out["text"]  # target-only prints the same text
    assert "target passes 19" in captured.err
    main_ok(base + ["--draft", str(draft), "--prompt", "hello", "--chat", "--no-stream", "-k", "2"])
    assert capsys.readouterr().out


def test_cli_inspect(capsys, zoo):
    main_ok(["inspect", str(zoo.target())])
    out = capsys.readouterr().out
    assert "qwen2: 3 layers" in out and "validation" in out and "verify(8)@32" in out
    main_ok(["inspect", str(zoo.target()), "--json"])
    assert json.loads(capsys.readouterr().out)["schema_version"] == specrt.SCHEMA_VERSION


def main_ok(args):
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), e.code


def test_cli_compare_reports_speedup_and_equality(capsys, zoo):
    main_ok(
        [
            "generate",
            "--target",
            str(zoo.target()),
            "--draft",
            str(zoo.noisy_draft()),
            "--prompt",
            "def f(x):",
            "--max-new-tokens",
            "16",
            "--ignore-eos",
            "--compare",
            "--no-stream",
        ]
    )
    err = capsys.readouterr().err
    assert "speedup; outputs identical" in err and "target-only" in err


def test_bench_runs_and_reports(capsys, zoo, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"name": "a", "prompt": "def f(x):"}\n{"name": "b", "prompt": "hello", "chat": true}\n')
    out = tmp_path / "r.json"
    main_ok(
        [
            "bench",
            "--target",
            str(zoo.target()),
            "--draft",
            str(zoo.noisy_draft()),
            "--prompts",
            str(prompts),
            "-k",
            "2,4",
            "--max-new-tokens",
            "12",
            "--repeats",
            "1",
            "--json",
            str(out),
        ]
    )
    table = capsys.readouterr().out
    assert table.count("\n| a |") == 3 and "| yes |" in table
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["config"] for r in rows[:3]] == ["target-only", "k=2", "k=4"]
    assert all(r["equal_to_target_only"] for r in rows if r["k"])
    assert all(r["predicted_speedup"] > 0 and r["verify_cost"] > 0 for r in rows if r["k"])
    assert all(sum(r["rounds_by_drafter"].values()) == sum(r["k_histogram"].values()) for r in rows)
    assert set(data["step_ms"]["a"]["target"]) == {"1", "2", "3", "4", "5"}
