"""A draft apart from the target (`load(draft_device=...)`, `--draft-device`): each model's sampler graphs run
on its own device and the two exchange token ids, plus the verified rows' q for a sampled verification.

Only the CPU provider runs here, so both "devices" are the CPU: asking for a draft device takes the same
exchange path as two devices would (a second sampler, the q read across as one block from the draft's
sampler), and the transfer counter counts what would cross between them."""

from __future__ import annotations

import pytest
from test_errors import assert_one_line_error, run_cli
from test_sampler_graphs import SETTINGS, _together

import specrt
from specrt import GenerationOptions
from specrt.errors import OptionsError

PROMPTS = ["def f(x):", "import os\n", "class A:", "for i in range(3):"]


@pytest.fixture(scope="module")
def engines(zoo):
    target, draft = zoo.target(), zoo.noisy_draft()
    return {
        "shared": specrt.load(target, draft, max_batch=4),
        "apart": specrt.load(target, draft, max_batch=4, draft_device="cpu"),
        "host": specrt.load(target, draft, max_batch=4, sampler="host"),
    }


def _options(i: int, setting: dict) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=24, num_draft_tokens=3, ignore_eos=True, seed=i, **setting)


def test_a_draft_apart_runs_its_own_sampler_and_gives_the_same_tokens(engines):
    apart = engines["apart"]
    assert apart.decider.draft_sampler is not apart.decider.sampler
    assert engines["shared"].decider.draft_sampler is engines["shared"].decider.sampler
    drafted = rejected = 0
    for i, setting in enumerate(SETTINGS):
        options = _options(i, setting)
        prompt = PROMPTS[i % len(PROMPTS)]
        got = {name: e.complete(prompt, options) for name, e in engines.items()}
        assert got["apart"].token_ids == got["shared"].token_ids == got["host"].token_ids, setting
        drafted += got["apart"].stats.drafted
        rejected += got["apart"].stats.drafted - got["apart"].stats.accepted
    assert drafted > 0 and rejected > 0  # drafts were verified, and some resampled
    # In a batch, with greedy and sampled rows together: each row as alone.
    options = [_options(i, SETTINGS[j]) for i, j in enumerate([1, 3, 0, 2])]
    alone = [apart.complete(p, o).token_ids for p, o in zip(PROMPTS, options, strict=True)]
    assert [g.token_ids for g in _together(apart, PROMPTS, options)] == alone
    assert max(apart.stats["batch_sizes"]) >= 2


def test_greedy_rows_exchange_ids_only_and_sampled_ones_the_drafted_q(engines):
    apart = engines["apart"]
    before = apart.stats["bytes_across_devices"]
    g = apart.complete("def f(x):", _options(0, SETTINGS[0]))
    assert g.stats.drafted > 0
    assert apart.stats["bytes_across_devices"] == before  # greedy: the model runs' own ids, nothing else
    g = apart.complete("def f(x):", _options(0, SETTINGS[2]))
    assert g.stats.drafted > 0
    vocab = apart.target.vocab_size
    across = apart.stats["bytes_across_devices"] - before
    assert across >= 4 * vocab * g.stats.drafted  # at least each drafted position's q once
    assert across <= 4 * vocab * (g.stats.drafted + g.stats.rounds)  # alone: no more than the drafted ones
    assert engines["shared"].stats["bytes_across_devices"] == 0


def test_a_broken_exchange_is_caught(engines, monkeypatch):
    """The verification reading the wrong q (the target sampler's own zeroed store instead of the draft's)
    changes sampled tokens: the equality above can see the exchange."""
    apart, host = engines["apart"], engines["host"]
    target_sampler = apart.decider.sampler
    target_sampler.ensure_steps(8, apart.target.vocab_size)
    monkeypatch.setattr(apart.decider.draft_sampler, "q_rows", target_sampler.q_rows)
    options = [_options(i, SETTINGS[2]) for i in range(4)]
    got = [apart.complete(p, o).token_ids for p, o in zip(PROMPTS, options, strict=True)]
    assert got != [host.complete(p, o).token_ids for p, o in zip(PROMPTS, options, strict=True)]


def test_a_draft_device_is_checked(zoo):
    with pytest.raises(OptionsError, match="draft_device 'gpu' is not cpu, cuda, cuda:N, tensorrt or tensorrt:N"):
        specrt.load(zoo.target(), zoo.noisy_draft(), draft_device="gpu")
    with pytest.raises(OptionsError, match="draft_device is set but no draft bundle is loaded"):
        specrt.load(zoo.target(), draft_device="cpu")


def test_the_cli_takes_a_draft_device(capsys, zoo):
    args = ["generate", "--target", zoo.target(), "--draft", zoo.noisy_draft(), "--prompt", "def f(x):"]
    args += ["--max-new-tokens", "4", "--no-stream"]
    code, _, err = run_cli(capsys, *args, "--draft-device", "tpu")
    assert_one_line_error(code, err, "draft_device 'tpu' is not cpu, cuda, cuda:N, tensorrt or tensorrt:N")
    from specrt.cli import main

    main([str(a) for a in args] + ["--draft-device", "cpu", "--json"])
    assert '"finish_reason": "max_new_tokens"' in capsys.readouterr().out
