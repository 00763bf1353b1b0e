"""Small units: the KV cache counter, options validation, the manifest schema, the tokenizer hash."""

from __future__ import annotations

import numpy as np
import pytest

from specrt import GenerationOptions, Manifest, OptionsError
from specrt.engine.generate import _held_back
from specrt.errors import BundleError, SchemaVersionError
from specrt.runtime.kvcache import KVCache


def test_kvcache_rollback_is_bookkeeping_only():
    kv = KVCache(num_layers=2, num_kv_heads=2, max_len=16, head_dim=16)
    assert kv.nbytes == 2 * 2 * 2 * 16 * 16 * 4
    buffers = [(k.data_ptr(), v.data_ptr()) for k, v in kv.layers]
    kv.rows[0].advance([1, 2, 3, 4, 5])
    kv.rows[0].rollback(2)
    assert kv.rows[0].ids == [1, 2, 3] and kv.rows[0].length == 3 and kv.rows[0].free == 13
    assert [(k.data_ptr(), v.data_ptr()) for k, v in kv.layers] == buffers  # nothing reallocated
    assert kv.rows[0].common_prefix([1, 2, 9, 4]) == 2 and kv.rows[0].common_prefix([1, 2, 3, 4, 5]) == 3
    kv.rows[0].truncate(10)  # no-op: holds fewer
    assert kv.rows[0].length == 3
    kv.rows[0].truncate(1)
    assert kv.rows[0].ids == [1]
    with pytest.raises(ValueError, match="overflow"):
        kv.rows[0].advance(list(range(16)))
    with pytest.raises(ValueError):
        kv.rows[0].rollback(2)
    kv.rows[0].reset()
    assert kv.rows[0].length == 0


def test_kvcache_buffers_are_in_memory_from_the_start():
    """A slot's first run must not fault its pages in (the draft's first catch-up in a slot ran 1.6x its later
    ones): writing every byte of a fresh cache faults no page. With `np.zeros` (pages mapped lazily) the same
    writes fault once per page: 16 (2 MiB huge pages) to 8192 (4 KiB pages) for the 32 MiB here."""
    import resource

    kv = KVCache(num_layers=2, num_kv_heads=2, max_len=4096, head_dim=64, rows=4)  # 4 buffers of 8 MiB
    assert kv.nbytes == 32 * 2**20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for buffer in kv._host:
        buffer.fill(1)
    faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faulted < 8, f"{faulted} page faults writing a fresh KV cache"


def test_options_defaults_and_normalisation():
    o = GenerationOptions(stop="END")
    assert o.stop == ("END",) and o.greedy and o.num_draft_tokens is None and o.max_draft_tokens == 8
    assert not GenerationOptions(temperature=0.5).greedy
    with pytest.raises(OptionsError, match="top_p must be in"):
        GenerationOptions(top_p=float("nan"))
    with pytest.raises(OptionsError, match="max_new_tokens"):
        GenerationOptions(max_new_tokens=True)
    with pytest.raises(OptionsError, match="stop"):
        GenerationOptions(stop=("",))
    # Temperatures a float32 does not hold as a usable divisor of the logits (the graphs' dtype) are refused.
    for temperature in (1e-300, 5e-324, 1e-31, 1e31, 1e300, 10**400):
        with pytest.raises(OptionsError, match=r"temperature must be .* within \[1e-30, 1e\+30\]"):
            GenerationOptions(temperature=temperature)
    assert not GenerationOptions(temperature=1e-30).greedy and GenerationOptions(temperature=1e30).temperature == 1e30


def test_held_back_tail():
    assert _held_back("hello wor", ("world",)) == 3
    assert _held_back("hello", ("xyz",)) == 0
    assert _held_back("ab", ("abc", "bx")) == 2


def test_manifest_round_trip_and_checks(zoo):
    m = Manifest.read(zoo.target())
    assert Manifest.from_dict(m.to_dict()) == m
    data = m.to_dict()
    data["schema_version"] = 0
    with pytest.raises(SchemaVersionError):
        Manifest.from_dict(data)
    data = m.to_dict()
    data["role"] = "oracle"
    with pytest.raises(BundleError, match="role must be target or draft, got 'oracle'"):
        Manifest.from_dict(data)
    data = m.to_dict()
    data["architecture"]["num_layers"] = "three"
    with pytest.raises(BundleError, match="expected int"):
        Manifest.from_dict(data)
    data = m.to_dict()
    data["future_field"] = {"x": 1}  # unknown fields of the same schema version are ignored
    assert Manifest.from_dict(data) == m


def test_tokenizer_hash_depends_on_the_id_mapping_only(zoo, tmp_path):
    import json

    from specrt.bundle.tokenizer import tokenizer_hash

    src = zoo.target() / "tokenizer.json"
    data = json.loads(src.read_text())
    same = dict(data, truncation={"max_length": 7, "strategy": "LongestFirst", "stride": 0, "direction": "Right"})
    (tmp_path / "a.json").write_text(json.dumps(same))
    assert tokenizer_hash(tmp_path / "a.json") == tokenizer_hash(src)
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped: a different tokenizer for pairing
    (tmp_path / "b.json").write_text(json.dumps(data))
    assert tokenizer_hash(tmp_path / "b.json") != tokenizer_hash(src)


def test_logits_are_written_in_place(zoo):
    """The session returns views of preallocated buffers: no per-step allocation of vocab-sized arrays."""
    from specrt import open_bundle
    from specrt.runtime.session import ModelSession

    s = ModelSession(open_bundle(zoo.target()))
    a = s.forward([1, 2, 3], keep=1)
    ptr = a.ctypes.data
    b = s.forward([4], keep=1)
    assert b.ctypes.data == ptr and np.isfinite(b).all()


def test_spinning_stops_between_runs_only_beside_a_draft(zoo):
    """Two sessions take turns on the same cores: beside a draft, each one's threads must stop spinning when
    its run returns (spinning on between runs doubled a 2-token verify); a lone target keeps spinning."""
    import specrt
    from specrt.tuning.measure import settings_key as _settings

    lone = specrt.load(zoo.target())
    assert lone.target.options.allow_spinning and lone.target.options.spin_between_runs
    pair = specrt.load(zoo.target(), zoo.noisy_draft())
    for session in (pair.target, pair.draft):
        assert session.options.allow_spinning and not session.options.spin_between_runs
    assert _settings(pair.target.options) == "t0-spin-run" and _settings(lone.target.options) == "t0-spin"
    off = specrt.load(zoo.target(), zoo.noisy_draft(), spinning=False)
    assert not off.draft.options.allow_spinning and _settings(off.target.options) == "t0-nospin"
    # Greedy output is the same whatever the threads do.
    ids = [1, 2, 3, 4, 5]
    opts = specrt.GenerationOptions(max_new_tokens=12, num_draft_tokens=2, ignore_eos=True)
    assert pair.complete(ids, opts).token_ids == off.complete(ids, opts).token_ids
