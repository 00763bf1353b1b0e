"""The runtime never imports torch, transformers or onnx: proven with those packages made unimportable."""

from __future__ import annotations

import json
import subprocess
import sys

BLOCKER = """
import sys, importlib.abc
BLOCKED = {"torch", "transformers", "optimum", "tensorrt", "onnx", "safetensors", "gguf"}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Blocker())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, timeout=300)


def _loads_none_of(imports: str, heavy: tuple[str, ...]) -> None:
    r = _run(f"{imports}\nheavy = [m for m in {heavy!r} if m in sys.modules]\nassert not heavy, heavy\nprint('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_import_specrt_stays_light():
    _loads_none_of(
        "import specrt, specrt.cli, specrt.engine.api, specrt.runtime.session", ("torch", "transformers", "onnx")
    )
    # `import specrt` itself (what a service does at start-up) loads no ONNX Runtime and no tokenizer either:
    # they are imported by the calls that need them (loading a bundle, encoding a prompt).
    _loads_none_of("import specrt", ("torch", "onnxruntime", "tokenizers", "onnx", "jinja2"))


def test_generate_runs_without_torch(zoo):
    target, draft = zoo.target(), zoo.noisy_draft()
    args = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompt",
        "def fibonacci(n):",
        "--max-new-tokens",
        "24",
        "--json",
        "--ignore-eos",
        "-k",
        "4",
    ]
    r = _run(f"from specrt.cli import main\nmain({args!r})")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["token_ids"]) == 24 and out["stats"]["drafted"] > 0
    # And the same through the Python API, speculative and target-only.
    r = _run(
        "import specrt\n"
        f"e = specrt.load({str(target)!r}, {str(draft)!r})\n"
        "o = specrt.GenerationOptions(max_new_tokens=16, ignore_eos=True)\n"
        "a = e.complete('x = np.arange(10)', o).token_ids\n"
        "b = e.complete('x = np.arange(10)', specrt.GenerationOptions(max_new_tokens=16, ignore_eos=True,"
        " num_draft_tokens=0)).token_ids\n"
        "assert a == b, (a, b)\n"
        "assert 'torch' not in sys.modules\nprint('ok')"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_export_without_extra_gives_clean_error(tmp_path):
    r = _run(f"from specrt.cli import main\nmain(['export', '--model', {str(tmp_path)!r}, '--role', 'target'])")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "pip install 'specrt[export]'" in r.stderr
