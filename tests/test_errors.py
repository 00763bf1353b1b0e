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


def _rerecord(bundle, name):
    """Make the manifest's file record agree with a changed file (so the next check down the line is hit)."""
    from specrt.bundle.integrity import sha256_file

    path = bundle / name

    def edit(m):
        next(f for f in m["files"] if f["name"] == name).update(size=path.stat().st_size, sha256=sha256_file(path))

    _edit_manifest(bundle, edit)


def test_corrupt_model_file(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    (bundle / "model.onnx").write_bytes(b"this is not a protobuf" * 10)
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "model.onnx", "has 220 bytes but the manifest records", "re-export")
    _rerecord(bundle, "model.onnx")  # a manifest that vouches for the broken graph: ONNX Runtime refuses it
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "model.onnx", "cannot load the graph", "re-export")


def test_missing_weights_file(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    (bundle / "model.onnx.data").unlink()
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "model.onnx.data is missing", "re-export")


def test_unknown_schema_version(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    _edit_manifest(bundle, lambda m: m.update(schema_version=99))
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "schema version 99 is not supported", "reads version 2")
    _edit_manifest(bundle, lambda m: m.update(schema_version=True))  # JSON true is not 1
    code, _, err = run_cli(capsys, *gen_args(bundle))
    assert_one_line_error(code, err, "schema version True is not supported")


def test_manifest_missing_field_and_bad_json(capsys, zoo, tmp_path):
    bundle = _copy(zoo.target(), tmp_path)
    _edit_manifest(bundle, lambda m: m["architecture"].pop("num_layers"))
    code, _, err = run_cli(capsys, "inspect", bundle)
    assert_one_line_error(code, err, "Architecture.num_layers")
    (bundle / "manifest.json").write_text("{not json")
    code, _, err = run_cli(capsys, "inspect", bundle)
    assert_one_line_error(code, err, "not valid JSON")


def test_mismatched_tokenizers(capsys, zoo, tmp_path):
    # A draft from another tokenizer (same size, different merges), consistent with its own manifest.
    zoo.tokenizer(320)
    other = tmp_path / "other-tokenizer"
    from specrt.export.tiny import CORPUS, make_tokenizer

    CORPUS.append("entirely different text shifts the learned merges " * 3)
    try:
        make_tokenizer(other, 320)
    finally:
        CORPUS.pop()
    draft = _copy(zoo.noisy_draft(), tmp_path)
    shutil.copy(other / "tokenizer.json", draft / "tokenizer.json")
    _rerecord(draft, "tokenizer.json")
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), "--draft", draft))
    assert_one_line_error(code, err, "tokenizers differ at id", "target", "same tokenizer")
    with pytest.raises(specrt.IncompatibleModelsError):
        specrt.load(zoo.target(), draft)


def test_vocab_size_mismatch(capsys, zoo):
    # Same tokenizer (so the same tokenizer hash), but the model's vocabulary is padded to 384 rows.
    zoo.checkpoint("vocab-384", "qwen2", vocab_size=384, tokenizer_vocab=320, seed=4)
    draft = zoo.bundle("vocab-384", "vocab-384", role="draft")
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), "--draft", draft))
    assert_one_line_error(
        code, err, "vocabulary sizes differ", "target 320", "draft 384", "--role target --vocab-size 384"
    )


def test_prompt_longer_than_max_seq_len(capsys, zoo):
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), prompt="print(x.sum()) " * 200))
    assert_one_line_error(code, err, "the prompt has", "at most 256", "--max-seq-len")


def test_empty_prompt(capsys, zoo):
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), prompt=""))
    assert_one_line_error(code, err, "prompt is empty")


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--temperature", "-1", "temperature must be a finite number >= 0"),
        ("--temperature", "nan", "temperature must be a finite number >= 0"),
        ("--temperature", "inf", "temperature must be a finite number >= 0"),
        ("--top-p", "-inf", "top_p must be in (0, 1]"),
        ("--max-draft-tokens", "0", "max_draft_tokens must be in 1..64"),
        ("--top-p", "0", "top_p must be in (0, 1]"),
        ("--top-p", "1.5", "top_p must be in (0, 1]"),
        ("--top-k", "-2", "top_k must be an integer >= 0"),
        ("--num-draft-tokens", "100", "num_draft_tokens must be 'auto' (None) or an integer in 0..64"),
        ("--num-draft-tokens", "many", "'many' is not 'auto' or an integer"),
        ("--max-new-tokens", "0", "max_new_tokens must be an integer >= 1"),
        ("--seed", "-5", "seed must be an integer >= 0"),
        ("--temperature", "hot", "'hot' is not a valid float"),
        ("--device", "gpu", "device 'gpu' is not cpu, cuda, cuda:N, tensorrt or tensorrt:N"),
        ("--device", "cuda:x", "device 'cuda:x' is not cpu, cuda, cuda:N, tensorrt or tensorrt:N"),
        ("--device", "cuda:1", "needs CUDAExecutionProvider, which this onnxruntime lacks"),
    ],
)
def test_invalid_sampling_options(capsys, zoo, flag, value, needle):
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), flag, value))
    assert_one_line_error(code, err, needle)


def test_prompt_file_not_utf8(capsys, zoo, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_bytes(b"def caf" + b"\xe9(x):\n")  # latin-1 e-acute
    args = ["generate", "--target", zoo.target(), "--prompt-file", f, "--max-new-tokens", "2"]
    code, _, err = run_cli(capsys, *args)
    assert_one_line_error(code, err, str(f), "not valid utf-8", "byte 0xe9 at offset 7", "--prompt-encoding")
    from specrt.cli import main

    main([str(a) for a in args] + ["--prompt-encoding", "latin-1", "--no-stream", "--json"])
    assert json.loads(capsys.readouterr().out)["finish_reason"] == "max_new_tokens"
    code, _, err = run_cli(capsys, *args, "--prompt-encoding", "klingon")
    assert_one_line_error(code, err, "--prompt-encoding 'klingon' is not a known text encoding")


def test_prompt_file_empty_or_missing(capsys, zoo, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    code, _, err = run_cli(capsys, "generate", "--target", zoo.target(), "--prompt-file", empty)
    assert_one_line_error(code, err, "prompt is empty")
    code, _, err = run_cli(capsys, "generate", "--target", zoo.target(), "--prompt-file", tmp_path / "absent.txt")
    assert_one_line_error(code, err, "absent.txt", "cannot read it")


def test_prompt_with_lone_surrogate(capsys, zoo):
    # What Python makes of undecodable bytes on the command line (surrogateescape).
    code, _, err = run_cli(capsys, *gen_args(zoo.target(), prompt="caf\udce9"))
    assert_one_line_error(code, err, "not valid Unicode text", "U+DCE9 at character 3")


def test_prompt_and_prompt_file_are_exclusive(capsys, zoo, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--target", zoo.target())
    assert code == 2 and "exactly one of --prompt or --prompt-file" in err


def test_unsupported_model_type_at_export(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    code, _, err = run_cli(capsys, "export", "--model", tmp_path / "m", "--role", "draft", "--out", tmp_path / "o")
    assert_one_line_error(
        code, err, "model_type 'gpt2' is not supported", "gemma2, gemma3_text, granite, llama, mistral, olmo2, phi3"
    )


def test_export_missing_model(capsys, tmp_path):
    code, _, err = run_cli(capsys, "export", "--model", tmp_path / "absent", "--role", "target")
    assert_one_line_error(code, err, "does not exist")


def test_debug_env_shows_traceback(zoo, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_DEBUG", "1")
    with pytest.raises(specrt.BundleError):
        main(["inspect", str(tmp_path)])
