"""Bundles that cannot lie: file records written at export, checked at load, names kept inside the folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from test_errors import _copy as copy_bundle
from test_errors import _edit_manifest as edit_manifest
from test_errors import _rerecord as rerecord
from test_errors import assert_one_line_error, run_cli

import specrt
from specrt.bundle.integrity import sha256_file
from specrt.bundle.loading import open_bundle


def swap_two_token_ids(bundle):
    """Exchange the ids of two ordinary tokens: the vocabulary size stays, the mapping does not."""
    path = bundle / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    size = path.stat().st_size
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))  # as `tokenizers` writes it
    assert path.stat().st_size == size  # ids of equal length: only the hash can tell


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_export_records_every_file(zoo):
    bundle = zoo.target()
    m = specrt.Manifest.read(bundle)
    assert m.schema_version == specrt.SCHEMA_VERSION == 2
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    on_disk = {name for name in on_disk if name != "manifest.json" and not name.startswith("profiles/")}
    assert {f.name for f in m.files} == on_disk
    kinds = {f.name: f.kind for f in m.files}
    samplers = ["pick_greedy", "pick_sampled", "pick_filtered", "verify_greedy", "verify_sampled", "verify_filtered"]
    assert kinds == {
        "model.onnx": "graph",
        "model.onnx.data": "weights",
        "tokenizer.json": "tokenizer",
        "chat_template.jinja": "chat_template",
        **{f"sampler/{name}.onnx": "graph" for name in samplers},
    }
    for f in m.files:  # the weights' hash was computed while writing; it equals a fresh one
        assert f.size == (bundle / f.name).stat().st_size
        assert f.sha256 == hashlib.sha256((bundle / f.name).read_bytes()).hexdigest()
    checks = open_bundle(bundle).checks
    assert [c.hashed for c in checks] == [f.kind != "weights" for f in m.files]
    assert all(c.hashed for c in open_bundle(bundle, verify=True).checks)


def test_changed_tokenizer_is_refused_at_load(zoo, tmp_path, capsys):
    draft = copy_bundle(zoo.noisy_draft(), tmp_path)
    expected = next(f.sha256 for f in specrt.Manifest.read(draft).files if f.name == "tokenizer.json")
    swap_two_token_ids(draft)
    with pytest.raises(specrt.BundleError) as e:
        specrt.load(zoo.target(), draft)
    message = str(e.value)
    assert "tokenizer.json" in message and expected in message and sha256_file(draft / "tokenizer.json") in message
    assert "restore the file or re-export" in message and "\n" not in message
    code, _, err = run_cli(capsys, "generate", "--target", zoo.target(), "--draft", draft, "--prompt", "x")
    assert_one_line_error(code, err, "tokenizer.json", "manifest records", "re-export")


def test_pair_check_compares_the_files_not_the_manifests(zoo, tmp_path):
    # A draft whose tokenizer changed AND whose manifest was made to agree: the file check passes, and the
    # pair check must still see that the two vocabularies map ids differently (it never reads manifest hashes).
    draft = copy_bundle(zoo.noisy_draft(), tmp_path)
    swap_two_token_ids(draft)
    rerecord(draft, "tokenizer.json")
    edit_manifest(draft, lambda m: m["tokenizer"].update(sha256=specrt.Manifest.read(zoo.target()).tokenizer.sha256))
    open_bundle(draft)  # consistent with itself
    with pytest.raises(specrt.IncompatibleModelsError, match="tokenizers differ"):
        specrt.load(zoo.target(), draft)
    # The same mapping written differently (reformatted JSON) is the same tokenizer for pairing.
    same = copy_bundle(zoo.noisy_draft(), tmp_path, "same")
    data = json.loads((same / "tokenizer.json").read_text())
    (same / "tokenizer.json").write_text(json.dumps(data, indent=4))
    rerecord(same, "tokenizer.json")
    engine = specrt.load(zoo.target(), same)
    assert engine.complete("def f(x):", specrt.GenerationOptions(max_new_tokens=4)).token_ids


def test_changed_graph_is_refused_even_at_the_same_size(zoo, tmp_path):
    bundle = copy_bundle(zoo.target(), tmp_path)
    flip_byte(bundle / "model.onnx", 200)
    with pytest.raises(specrt.BundleError, match=r"model\.onnx has SHA-256 .* but the manifest records"):
        specrt.load(bundle)


def test_weights_size_checked_at_load_and_hash_on_request(zoo, tmp_path, capsys):
    bundle = copy_bundle(zoo.target(), tmp_path)
    data = bundle / "model.onnx.data"
    size = data.stat().st_size
    with open(data, "ab") as f:
        f.write(b"\0")
    with pytest.raises(
        specrt.BundleError, match=rf"model\.onnx\.data has {size + 1} bytes but the manifest records {size}"
    ):
        specrt.load(bundle)
    with open(data, "r+b") as f:
        f.truncate(size)
    flip_byte(data, size // 2)  # same size, different bytes: a plain load cannot see it ...
    specrt.load(bundle)
    with pytest.raises(specrt.BundleError, match=r"model\.onnx\.data has SHA-256"):
        specrt.load(bundle, verify=True)  # ... a verifying load can
    code, out, err = run_cli(capsys, "verify", bundle)
    assert_one_line_error(code, err, "model.onnx.data", "SHA-256", "re-export")
    assert "model.onnx.data" in out and "MISMATCH" in out and "9 of 10 files match" in out


def test_verify_prints_every_file(zoo, capsys):
    from specrt.cli import main

    main(["verify", str(zoo.target())])  # returns: exit code 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 11 and all(" ok " in line for line in lines[:10]) and "10 of 10 files match" in lines[-1]


@pytest.mark.parametrize(
    "field,value,needle",
    [
        (("graph", "model_file"), "/etc/passwd", "not a plain file name"),
        (("graph", "data_file"), "../elsewhere/model.onnx.data", "not a plain file name"),
        (("tokenizer", "chat_template"), "C:\\templates\\x.jinja", "not a plain file name"),
        (("files", 0, "name"), "sub/../../x", "not a plain file name"),
    ],
)
def test_names_outside_the_bundle_are_refused(zoo, tmp_path, capsys, field, value, needle):
    bundle = copy_bundle(zoo.target(), tmp_path)

    def edit(m):
        node = m
        for key in field[:-1]:
            node = node[key]
        node[field[-1]] = value

    edit_manifest(bundle, edit)
    code, _, err = run_cli(capsys, "generate", "--target", bundle, "--prompt", "x")
    assert_one_line_error(code, err, needle, repr(value))


def test_symlink_leading_out_of_the_bundle_is_refused(zoo, tmp_path):
    bundle = copy_bundle(zoo.target(), tmp_path)
    outside = tmp_path / "outside.data"
    shutil.move(bundle / "model.onnx.data", outside)
    os.symlink(outside, bundle / "model.onnx.data")
    with pytest.raises(specrt.BundleError, match="leads outside the bundle folder"):
        specrt.load(bundle)
    # A symlink that stays inside the folder is fine.
    (bundle / "model.onnx.data").unlink()
    shutil.move(outside, bundle / "weights.bin")
    os.symlink("weights.bin", bundle / "model.onnx.data")
    specrt.load(bundle)


def test_previous_schema_is_refused_with_the_command_that_rebuilds_it(zoo, tmp_path, capsys):
    bundle = copy_bundle(zoo.target(), tmp_path)
    source = specrt.Manifest.read(bundle).source.path

    def downgrade(m):
        m["schema_version"] = 1
        del m["files"]

    edit_manifest(bundle, downgrade)
    with pytest.raises(specrt.SchemaVersionError) as e:
        specrt.load(bundle)
    message = str(e.value)
    assert "schema version 1" in message and "no integrity record" in message
    command = message.split("re-export it: ", 1)[1]
    assert command == f"specrt export --model {source} --role target --quant none --out {bundle} --overwrite"
    (bundle / "profiles").mkdir(exist_ok=True)  # an old bundle's timings do not block the re-export ...
    (bundle / "profiles" / "old.json").write_text("{}")
    from specrt.cli import main

    main([*command.split()[1:], "--no-validate", "--no-profile", "--quiet", "--max-seq-len", "256"])
    assert not (bundle / "profiles").exists()  # ... and are dropped with the graph they timed
    assert specrt.Manifest.read(bundle).schema_version == 2
    specrt.load(bundle, verify=True)


def test_manifest_that_disagrees_with_the_graph_is_refused(zoo, tmp_path):
    bundle = copy_bundle(zoo.target(), tmp_path)
    heads = specrt.Manifest.read(bundle).architecture.num_kv_heads
    edit_manifest(bundle, lambda m: m["architecture"].update(num_kv_heads=heads * 2, num_heads=heads * 4))
    with pytest.raises(specrt.BundleError, match="the graph's KV buffer dimensions are"):
        specrt.load(bundle)
    edit_manifest(bundle, lambda m: m["architecture"].update(num_kv_heads=heads, num_layers=2))
    with pytest.raises(specrt.BundleError, match="graph has inputs the manifest does not describe"):
        specrt.load(bundle)
    edit_manifest(bundle, lambda m: m.update(max_seq_len=100000, architecture=dict(m["architecture"], num_layers=3)))
    with pytest.raises(specrt.BundleError, match="100000"):
        specrt.load(bundle)


def test_interleaved_generations_each_get_their_own_output(zoo):
    """Two generations read in turns on one engine (batch 1: the second waits for the slot) each produce
    exactly what they produce alone."""
    import itertools

    engine = specrt.load(zoo.target())
    options = specrt.GenerationOptions(max_new_tokens=6, ignore_eos=True)
    alone = [engine.complete(p, options).token_ids for p in ("def f(x):", "The quick")]
    first, second = engine.generate("def f(x):", options), engine.generate("The quick", options)
    for _ in itertools.zip_longest(first, second):  # a piece of one, then of the other
        pass
    assert [first.token_ids, second.token_ids] == alone
