"""scripts/device_check.py runs end to end on the CPU up to the provider switch, and a section that fails is
recorded as failed, not hidden."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/device_check.py"),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "w"),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_device_check_runs_on_the_cpu(tmp_path):
    report = _run(tmp_path, "--device", "cpu", "--reps", "2")
    sections = report["sections"]
    assert [k for k, v in sections.items() if not v.get("ok")] == [], sections
    assert set(sections) >= {
        "machine",
        "bundles",
        "parity",
        "placement_tiny",
        "equality_tiny",
        "steps_tiny",
        "apart_tiny",
    }
    assert sections["parity"]["target-fp32"]["top1_agreement"] == 1.0
    assert sections["equality_tiny"]["drafted"] > 0
    assert sections["apart_tiny"]["sampled_equal_to_shared"]  # one CPU: the same q either way
    assert sections["apart_tiny"]["sampled_bytes_across_per_drafted"] >= 4 * 256  # a q row per draft at least
    # only ids cross: a few hundred bytes a round at batch 8, not a vocabulary row (384 floats = 1,536 B a row)
    assert sections["speed_tiny"]["b8_bytes_to_host_per_round"] < 1536


def test_a_failing_section_is_recorded(tmp_path):
    """A device this onnxruntime lacks: loading fails, the failure is in the JSON, the run still ends."""
    sections = _run(tmp_path, "--device", "cuda", "--reps", "1")["sections"]
    assert sections["bundles"]["ok"] and sections["machine"]["ok"]
    assert sections["placement_tiny"]["ok"] is False
    assert "CUDAExecutionProvider" in sections["placement_tiny"]["error"]
