"""Shared fixtures: tiny random checkpoints and the bundles exported from them (built once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specrt.export import ExportOptions, Progress, export_bundle
from specrt.export.tiny import make_checkpoint, make_tokenizer

MAX_SEQ_LEN = 256
# Under CI a missing prerequisite (an extra not installed, curl absent, the real bundles not built) is a
# failure, not a skip: a renamed bundle or a dropped extra must not turn checks into green skips.
STRICT = os.environ.get("CI", "").lower() == "true"
# The graph flavour of every bundle the suite builds (SPECRT_TEST_GRAPH=gqa runs it all on the other one).
GRAPH = os.environ.get("SPECRT_TEST_GRAPH", "standard")


class Zoo:
    """Lazily built checkpoints and bundles under one temporary folder, keyed by name."""

    def __init__(self, root: Path):
        self.root = root
        self._tokenizers: dict[int, Path] = {}
        self._checkpoints: dict[str, Path] = {}
        self._bundles: dict[str, Path] = {}

    def tokenizer(self, vocab_size: int = 320) -> Path:
        if vocab_size not in self._tokenizers:
            path = self.root / f"tokenizer-{vocab_size}"
            make_tokenizer(path, vocab_size)
            self._tokenizers[vocab_size] = path
        return self._tokenizers[vocab_size]

    def checkpoint(
        self, name: str, model_type: str = "qwen2", noise_from: str | None = None, tokenizer_vocab=None, **kw
    ) -> Path:
        if name not in self._checkpoints:
            tokenizer = self.tokenizer(tokenizer_vocab or kw.get("vocab_size", 320))
            source = self.checkpoint(noise_from) if noise_from else None
            self._checkpoints[name] = make_checkpoint(
                self.root / "ckpt" / name, tokenizer, model_type, noise_from=source, **kw
            )
        return self._checkpoints[name]

    def bundle(self, name: str, checkpoint: str, **options) -> Path:
        if name not in self._bundles:
            options.setdefault("max_seq_len", MAX_SEQ_LEN)
            options.setdefault("graph", GRAPH)
            out = self.root / "bundles" / name
            export_bundle(self.checkpoint(checkpoint), out, ExportOptions(**options), Progress(enabled=False))
            self._bundles[name] = out
        return self._bundles[name]

    # The standard pair used across the suite: a qwen2 target, a noisy copy as draft (~55% acceptance
    # greedy), and an unrelated 1-layer llama draft sharing the tokenizer.
    def target(self) -> Path:
        self.checkpoint("target", "qwen2", layers=3)
        return self.bundle("target", "target")

    def noisy_draft(self) -> Path:
        self.target()
        self.checkpoint("noisy", noise_from="target", noise=0.05, seed=1)
        return self.bundle("noisy", "noisy", role="draft")

    def small_draft(self) -> Path:
        self.checkpoint("small", "llama", layers=1, seed=7)
        return self.bundle("small", "small", role="draft")


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Zoo:
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    return Zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(autouse=True)
def quiet_machine(request, monkeypatch):
    """Profiles are kept out of a bundle when other processes held the CPUs while they were measured
    (tuning/machineload.py). What a test measures is not about the machine's neighbours, so every test sees a
    quiet machine, except those marked `machine_load`, which test that check itself."""
    if request.node.get_closest_marker("machine_load") is None:
        from specrt.tuning import machineload

        monkeypatch.setattr(machineload, "snapshot", lambda: ((0, 0), 0))  # no time passes: share unknown
        monkeypatch.setattr(machineload, "MIN_WINDOW_S", 0.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every prerequisite must be present: {reason}"


def import_or_skip(name: str):
    """pytest.importorskip, except under CI, where a missing extra is an ImportError (a failed run)."""
    import importlib

    return importlib.import_module(name) if STRICT else pytest.importorskip(name)
