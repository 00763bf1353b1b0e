"""Verify-cost profiles: how long one forward of S new tokens takes, per bundle, machine and settings.

The numbers belong to the machine, not the model: a profile is stored inside the bundle under
`profiles/`, keyed by a signature of the host CPU model, core count, ONNX Runtime version and device name
(not yet the GPU model), plus the session settings (threads, spinning) it was measured with.
`specrt profile BUNDLE` measures one, and `specrt export` runs it at the end of an export; an engine
without a profile for its machine measures a quick one (one context, two repetitions) the first time it
needs it and saves it as `...-quick.json`, used until a full one exists. Only timing lives here; choosing
k from it is costmodel.py's job.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from .batchcost import BATCHES, BatchProfile, BatchProfiles, clamp_contexts, measure_batches
from .batchcost import CONTEXTS as BATCH_CONTEXTS
from .batchcost import REPS as BATCH_REPS
from .batchcost import WIDTHS as BATCH_WIDTHS
from .session import ModelSession, SessionOptions

PROFILE_DIR = "profiles"
WIDTHS = tuple(range(1, 17))
CONTEXTS = (64, 512, 2048)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_signature(options: SessionOptions) -> dict:
    import onnxruntime

    return {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "onnxruntime": onnxruntime.__version__,
        "device": options.device,
    }


def _key(signature: dict) -> str:
    return hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:12]


def _settings(options: SessionOptions) -> str:
    return f"t{options.intra_op_threads}-{spin_mode(options)}"


def spin_mode(options: SessionOptions) -> str:
    """spin (during and between runs), spin-run (during runs only) or nospin."""
    if not options.allow_spinning:
        return "nospin"
    return "spin" if options.spin_between_runs else "spin-run"


@dataclass
class CostProfile:
    machine: dict
    settings: str
    contexts: list[int]
    widths: list[int]
    ms: list[list[float]]  # ms[context index][width index], medians
    created: str = ""

    def __call__(self, width: int, context: int) -> float:
        """t(width) at `context` tokens: linear in context between measured points, flat outside; widths
        past the measured range extrapolate from the last two points."""
        rows = [self._at_width(r, width) for r in self.ms]
        if context <= self.contexts[0]:
            return rows[0]
        for (c0, r0), (c1, r1) in zip(
            zip(self.contexts, rows, strict=True), zip(self.contexts[1:], rows[1:], strict=True), strict=False
        ):
            if context <= c1:
                return r0 + (r1 - r0) * (context - c0) / (c1 - c0)
        return rows[-1]

    def _at_width(self, row: list[float], width: int) -> float:
        if width in self.widths:
            return row[self.widths.index(width)]
        if width < self.widths[0]:
            return row[0]
        if len(self.widths) == 1:  # one measured width: proportional, an upper bound
            return row[0] * width / self.widths[0]
        w0, w1 = self.widths[-2:]
        return row[-1] + (row[-1] - row[-2]) / (w1 - w0) * (width - w1)

    def ratio(self, width: int, context: int) -> float:
        return self(width, context) / self(1, context)

    def path(self, bundle: Path) -> Path:
        return bundle / PROFILE_DIR / f"{_key(self.machine)}-{self.settings}.json"

    def save(self, bundle: Path) -> Path | None:
        """Write into the bundle; a read-only bundle just keeps the profile in memory."""
        path = self.path(bundle)
        try:
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(asdict(self), indent=1))
        except OSError:
            return None
        return path


def load_profile(bundle: Path, options: SessionOptions) -> CostProfile | None:
    """The profile for this machine, preferring the same settings; None if the machine was never profiled."""
    folder = bundle / PROFILE_DIR
    machine = _key(machine_signature(options))
    exact = folder / f"{machine}-{_settings(options)}.json"
    candidates = [exact] + sorted(folder.glob(f"{machine}-*.json")) if folder.is_dir() else []
    for path in candidates:
        if path.is_file():
            try:
                profile = CostProfile(**json.loads(path.read_text()))
            except (ValueError, TypeError, RecursionError):
                continue
            if _well_formed(profile):  # a damaged or hand-edited profile is as good as none
                return profile
    return None


def _well_formed(p: CostProfile) -> bool:
    def ascending(xs, low):
        return isinstance(xs, list) and xs and all(type(x) is int and x >= low for x in xs) and xs == sorted(set(xs))

    def times(row):
        return (
            isinstance(row, list)
            and len(row) == len(p.widths)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e7 for v in row)
        )

    return (
        isinstance(p.machine, dict)
        and isinstance(p.settings, str)
        and ascending(p.contexts, 0)
        and ascending(p.widths, 1)
        and isinstance(p.ms, list)
        and len(p.ms) == len(p.contexts)
        and all(times(row) for row in p.ms)
    )


def measure(
    session: ModelSession,
    widths: tuple[int, ...] | list[int] = WIDTHS,
    contexts: tuple[int, ...] | list[int] = CONTEXTS,
    reps: int = 3,
    slot: int = 0,
) -> CostProfile:
    """Median time of one forward of S tokens after `context` cached positions, for every (context, S).

    The cached positions are not computed: attention costs the same whatever the cached values are, so the
    cache length is simply set, which makes a 2048-token context free to measure.
    Points are measured in interleaved rounds (a warm-up round first), so drift on a shared machine spreads
    over all of them; then t(S) = min over S' >= S, since more new tokens never take less time and noise
    on a busy machine only ever adds time.
    """
    # Contexts beyond what the buffers hold are measured at the largest one that fits (never dropped: an
    # empty profile would answer nothing).
    contexts = sorted({max(0, min(c, session.max_len - max(widths))) for c in contexts})
    row = session.kv.rows[slot]  # the slot measured in: what it held is gone (the caller gives a free one)
    times: dict[tuple[int, int], list[float]] = {(c, w): [] for c in contexts for w in widths}
    for rnd in range(reps + 1):
        for c, w in times if rnd % 2 else reversed(list(times)):
            row.reset()
            row.advance([0] * c)
            t0 = time.perf_counter()
            session.forward_slot(slot, [0] * w, keep=w)
            if rnd:
                times[c, w].append(1000 * (time.perf_counter() - t0))
    row.reset()
    ms = []
    for c in contexts:
        row = [statistics.median(times[c, w]) for w in widths]
        ms.append([min(row[i:]) for i in range(len(row))])
    return CostProfile(
        machine=machine_signature(session.options),
        settings=_settings(session.options),
        contexts=contexts,
        widths=list(widths),
        ms=ms,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def profile_for(session: ModelSession, max_width: int, context: int, slot: int = 0) -> CostProfile:
    """The cached profile of this session's machine, or a quick one measured now in `slot` (and cached)."""
    found = load_profile(session.bundle.path, session.options)
    if found is not None and max(found.widths) >= max_width:
        return found
    quick = measure(session, widths=list(range(1, max_width + 1)), contexts=[max(context, 1)], reps=2, slot=slot)
    # Saved under a name of its own ("...-quick"), so that `specrt inspect` tells it from a full one and a
    # full profile of the same settings, once measured, is the one loaded.
    quick.settings += "-quick"
    quick.save(session.bundle.path)
    return quick


def batch_profile_for(session: ModelSession) -> BatchProfiles:
    """t(B, S) at the measured context lengths for this session's bundle on this machine: read from the
    bundle, or measured now over all of the session's slots (the caller makes sure none holds a running
    sequence) and saved."""
    path = (
        session.bundle.path
        / PROFILE_DIR
        / f"{_key(machine_signature(session.options))}-{_settings(session.options)}-batch.json"
    )
    slots = len(session.kv.rows)
    try:
        found = BatchProfiles([BatchProfile(**p) for p in json.loads(path.read_text())["profiles"]])
        first = found.profiles[0]
        wide_enough = max(first.batches) >= min(slots, max(BATCHES)) and first.widths == list(BATCH_WIDTHS)
        # An older file (one context, or fewer timed rounds than REPS) is measured again.
        contexts = clamp_contexts(BATCH_CONTEXTS, session.max_len, BATCH_WIDTHS)
        if wide_enough and found.reps >= BATCH_REPS and [p.context for p in found.profiles] == contexts:
            return found
    except (OSError, ValueError, TypeError, KeyError):
        pass
    batches = sorted({b for b in BATCHES if b <= slots} | {slots})
    prof = measure_batches(session, batches, BATCH_WIDTHS)
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"profiles": [asdict(p) for p in prof.profiles]}, indent=1))
    except OSError:
        pass
    return prof
