"""Bundles as an export on a busy machine leaves them: hard-linked copies whose stored step-cost profiles
are scaled by a factor (the weights are shared with the original, only the profile files are new).

A benchmark of auto k on such copies shows whether the engine notices that live timings disagree with the
profile and recovers (issue: a profile stored while another job held the cores said t(1) = 148 ms for the
int4 1.5B target and 110 ms for the 0.5B draft, about 5x and 11x the quiet machine's).

    python scripts/busy_bundles.py engines/qwen2.5-coder-1.5b-int4 5 /tmp/busy/target
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def _scale(data, factor: float):
    if isinstance(data, dict):
        return {k: (_scale_table(v, factor) if k == "ms" else _scale(v, factor)) for k, v in data.items()}
    if isinstance(data, list):
        return [_scale(v, factor) for v in data]
    return data


def _scale_table(table: list[list[float]], factor: float) -> list[list[float]]:
    return [[v * factor for v in row] for row in table]


def scaled_copy(bundle: Path, factor: float, dest: Path) -> Path:
    """A copy of `bundle` at `dest` (files hard-linked, profiles/ rewritten with every time x factor)."""
    bundle, dest = Path(bundle), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(bundle, dest, copy_function=os.link, ignore=shutil.ignore_patterns("profiles"))
    (dest / "profiles").mkdir()
    for path in sorted((bundle / "profiles").glob("*.json")) if (bundle / "profiles").is_dir() else []:
        (dest / "profiles" / path.name).write_text(json.dumps(_scale(json.loads(path.read_text()), factor)))
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: busy_bundles.py BUNDLE FACTOR DEST")
    print(scaled_copy(Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])))
