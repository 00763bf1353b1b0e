"""Bad input: one clean line on stderr and exit code 2 from the CLI, a SpecrtError from the API."""

from __future__ import annotations

import json
import shutil

import pytest

import specrt
from specrt.cli import main


def run_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def _copy(bundle, tmp_path, name="copy"):
    return shutil.copytree(bundle, tmp_path / name)


def _edit_manifest(bundle, edit):
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def gen_args(target, *extra, prompt="def f(x):"):
    return ["generate", "--target", target, "--prompt", prompt, "--max-new-tokens", "4", *extra]


def test_missing_bundle_folder(capsys, tmp_path):
    code, _, err = run_cli(capsys, *gen_args(tmp_path / "nope"))
    assert_one_line_error(code, err, "nope", "does not exist")


def test_empty_bundle_folder(capsys, tmp_path):
    code, _, err = run_cli(capsys, *gen_args(tmp_path))
    assert_one_line_error(code, err, "no manifest.json", "specrt export")


def test_corrupt_model_file(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    (bundle / "model.onnx").write_bytes(b"this is not a protobuf" * 10)
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "model.onnx", "cannot load the graph", "re-export")


def test_missing_weights_file(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    (bundle / "model.onnx.data").unlink()
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "missing model.onnx.data")


def test_unknown_schema_version(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    _edit_manifest(bundle, lambda m: m.update(schema_version=99))
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "schema version 99 is not supported", "reads version 1")


def test_manifest_missing_field_and_bad_json(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    _edit_manifest(bundle, lambda m: m["architecture"].pop("num_layers"))
    code, _, err = run_cli(capsys, "inspect", bundle)
    assert_one_line_error(code, err, "Architecture.num_layers")
    (bundle / "manifest.json").write_text("{not json")
    code, _, err = run_cli(capsys, "inspect", bundle)
    assert_one_line_error(code, err, "not valid JSON")


def test_mismatched_tokenizers(capsys, zoo, tmp_path):
    draft = _copy(zoo.noisy_draft(), tmp_path)
    _edit_manifest(draft, lambda m: m["tokenizer"].update(sha256="0" * 64))
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), "--draft", draft))
    assert_one_line_error(code, err, "tokenizers differ", "000000000000", "target")
    with pytest.raises(specrt.IncompatibleModelsError):
        specrt.load(zoo.target(), draft)


def test_vocab_size_mismatch(capsys, zoo):
    # Same tokenizer (so the same tokenizer hash), but the model's vocabulary is padded to 384 rows.
    zoo.checkpoint("vocab-384", "qwen2", vocab_size=384, tokenizer_vocab=320, seed=4)
    draft = zoo.bundle("vocab-384", "vocab-384", role="draft")
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), "--draft", draft))
    assert_one_line_error(code, err, "vocabulary sizes differ", "target 320", "draft 384")


def test_prompt_longer_than_max_seq_len(capsys, zoo):
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), prompt="print(x.sum()) " * 200))
    assert_one_line_error(code, err, "the prompt has", "at most 256", "--max-seq-len")


def test_empty_prompt(capsys, zoo):
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), prompt=""))
    assert_one_line_error(code, err, "prompt is empty")


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--temperature", "-1", "temperature must be >= 0"),
        ("--top-p", "0", "top_p must be in (0, 1]"),
        ("--top-p", "1.5", "top_p must be in (0, 1]"),
        ("--top-k", "-2", "top_k must be an integer >= 0"),
        ("--num-draft-tokens", "100", "num_draft_tokens must be 'auto' (None) or an integer in 0..64"),
        ("--num-draft-tokens", "many", "'many' is not 'auto' or an integer"),
        ("--max-new-tokens", "0", "max_new_tokens must be an integer >= 1"),
        ("--seed", "-5", "seed must be an integer >= 0"),
        ("--temperature", "hot", "'hot' is not a valid float"),
    ],
)
def test_invalid_sampling_options(capsys, zoo, flag, value, needle):
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), flag, value))
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_prompt_and_prompt_file_are_exclusive(capsys, zoo, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--target", zoo.target())
    assert code == 2 and "exactly one of --prompt or --prompt-file" in err


def test_unsupported_model_type_at_export(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    code, _, err = run_cli(capsys, "export", "--model", tmp_path / "m", "--role", "draft", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "model_type 'gpt2' is not supported", "llama, mistral, qwen2, qwen3")


def test_export_missing_model(capsys, tmp_path):
    code, _, err = run_cli(capsys, "export", "--model", tmp_path / "absent", "--role", "target")
    assert_one_line_error(code, err, "does not exist")


def test_debug_env_shows_traceback(zoo, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_DEBUG", "1")
    with pytest.raises(specrt.BundleError):
        main(["inspect", str(tmp_path)])
