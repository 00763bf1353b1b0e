"""Bundle integrity: the files a manifest names stay inside the bundle folder and are what was exported.

The exporter records every file of a bundle in the manifest (`files`: name, kind, size, SHA-256). At load,
`check_files` confirms each one: files of every kind by size, and the small ones (graph, tokenizer, chat
template: a few MB, hashed in milliseconds) by SHA-256 as well; the weight data (GBs) is hashed too when
asked (`specrt verify DIR`, `specrt.load(..., verify=True)`). `resolve_inside` refuses names that are
absolute or lead out of the folder (`..`, symlinks pointing elsewhere), so a manifest can only ever make
the runtime read files of its own bundle. This module reads files; it knows nothing about ONNX or models.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..errors import BundleError

# What each kind of file is; "weights" are checked by size at every load and by hash only on request.
KINDS = ("graph", "weights", "tokenizer", "chat_template")
HASHED_AT_LOAD = ("graph", "tokenizer", "chat_template")
_CHUNK = 1 << 23


@dataclass(frozen=True)
class FileRecord:
    """One file of a bundle as the exporter wrote it."""

    name: str  # relative to the bundle folder, '/'-separated
    kind: str  # one of KINDS
    size: int  # bytes
    sha256: str  # hex digest of the whole file


@dataclass(frozen=True)
class FileCheck:
    """What was found for one FileRecord: `ok` is False on a size or hash mismatch or a missing file."""

    record: FileRecord
    found_size: int | None  # None: missing
    found_sha256: str | None  # None: not hashed (weights at a plain load) or missing
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        if self.found_size != self.record.size:
            return False
        return self.found_sha256 is None or self.found_sha256 == self.record.sha256

    @property
    def hashed(self) -> bool:
        return self.found_sha256 is not None

    def problem(self, folder: Path) -> str:
        """The one-line error for a failed check: the file, the expected and found values, the fix."""
        r, where = self.record, folder / self.record.name
        fix = "restore the file or re-export the bundle"
        if self.found_size is None:
            return f"{where} is missing; the bundle is incomplete: {fix}"
        if self.found_size != r.size:
            return f"{where} has {self.found_size} bytes but the manifest records {r.size}: it was changed; {fix}"
        return (
            f"{where} has SHA-256 {self.found_sha256} but the manifest records {r.sha256}: it was changed "
            f"after export; {fix}"
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record(folder: Path, name: str, kind: str, sha256: str | None = None) -> FileRecord:
    """The record of a finished file (its hash computed here unless the writer already knows it)."""
    path = folder / name
    return FileRecord(name, kind, path.stat().st_size, sha256 or sha256_file(path))


def check_name(name: str, what: str, where: str | Path) -> None:
    """Refuse a file name that is not a plain relative path (absolute, a drive, '..', a NUL byte)."""
    bad = (
        not isinstance(name, str)
        or not name
        or "\0" in name
        or PurePosixPath(name).is_absolute()
        or PureWindowsPath(name).is_absolute()
        or bool(PureWindowsPath(name).drive)
        or ".." in PurePosixPath(name.replace("\\", "/")).parts
    )
    if bad:
        raise BundleError(
            f"{where}: {what} {name!r} is not a plain file name inside the bundle folder (absolute or "
            "containing '..'); the manifest was edited: re-export the bundle"
        )


def resolve_inside(folder: Path, name: str, what: str) -> Path:
    """`folder / name`, refusing names that are absolute or lead outside the folder (also via symlinks)."""
    check_name(name, what, folder)
    root = folder.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise BundleError(
            f"{folder}: {what} {name!r} leads outside the bundle folder (to {path}); a bundle only reads its "
            "own files: copy the file into the bundle or re-export it"
        )
    return path


def check_file(folder: Path, rec: FileRecord, full: bool) -> FileCheck:
    """Check one file: size always; SHA-256 for small kinds, or for every kind when `full`."""
    path = resolve_inside(folder, rec.name, f"{rec.kind} file")
    if not path.is_file():
        return FileCheck(rec, None, None)
    t0 = time.perf_counter()
    size = path.stat().st_size
    digest = None
    if size == rec.size and (full or rec.kind in HASHED_AT_LOAD):
        digest = sha256_file(path)
    return FileCheck(rec, size, digest, time.perf_counter() - t0)


def check_files(folder: Path, records: list[FileRecord], full: bool = False, stop_at_first: bool = True):
    """Check every record; raise BundleError at the first failure (or return all checks, for reports)."""
    checks = []
    for rec in records:
        c = check_file(folder, rec, full)
        if not c.ok and stop_at_first:
            raise BundleError(c.problem(folder))
        checks.append(c)
    return checks
