"""Measuring step costs and keeping them: one timing loop, the profiles it fills, and their files.

The numbers belong to the machine, not the model: a profile is stored inside the bundle under
`profiles/`, keyed by a signature of the host CPU model, core count, ONNX Runtime version and device name
(not yet the GPU model), plus the session settings (threads, spinning) it was measured with.
`specrt profile BUNDLE` measures one, and `specrt export` runs it at the end of an export; an engine
without a profile for its machine measures a quick one (one context, two repetitions) the first time it
needs it and saves it as `...-quick.json`, used until a full one exists. The batch engine's t(B, S)
profiles are measured over all of a session's slots and stored as `...-batch.json`; until an engine has
measured them (in an idle moment: engine/api.py), `batch_estimate` prices its batch from the one-row profile.

Every measurement goes through `time_cells`: each cell once per round, a warm-up round first, rounds
interleaved with the order reversed every other round (drift on a shared machine spreads over all cells),
medians; then t(S) = min over S' >= S, since more new tokens never take less time and noise on a busy
machine only ever adds time. Cached positions are not computed: attention costs the same whatever the
cached values are, so a context is set by moving a slot's length counter, which makes a 2048-token context
free to measure.

Timings taken while other processes held the cores price every step too high for good, so each measurement
is watched (machineload.py): one during which others took more than a small share of the CPUs is repeated
(`tries`), and one still busy is returned marked (`others_share`) and never stored; the engine then measures
again the next time it needs the profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from ..bundle.manifest import PROFILE_DIR
from ..runtime.session import ModelSession, SessionOptions
from .machineload import BUSY_SHARE, OtherLoad
from .profile import BatchProfile, BatchProfiles, CostProfile, well_formed

WIDTHS = tuple(range(1, 17))  # per-request profiles: verify widths up to k = 15
CONTEXTS = (64, 512, 2048)
BATCHES = (1, 2, 4, 8)
BATCH_WIDTHS = tuple(range(1, 10))
BATCH_CONTEXTS = (64, 512)  # between and past them t is linear in the context
# Timed rounds per batch cell. With 2, one disturbed round moved a cell's median by half: a native 1.5B
# profile stored t(8, 1) = 180 ms against 120 measured again, which priced a 2-token verify at 1.14 plain
# steps instead of 1.55, and auto k drafted 1 token per row at 8 requests, 0.87x plain batching. A median of
# 4 interleaved rounds outvotes one disturbed round on either side.
BATCH_REPS = 4


# ---------------------------------------------------------------------------------------------- the loop


class Interrupted(Exception):
    """A measurement given up before its end (`stop()` said so: work arrived): it measured nothing."""


def time_cells(
    cells: Sequence[Hashable], setup: Callable, run: Callable, reps: int, stop: Callable[[], bool] | None = None
) -> dict[Hashable, float]:
    """Median milliseconds of run(cell) for every cell: setup(cell) (untimed) then run(cell) (timed), once per
    round, `reps` timed rounds after one warm-up round, order reversed every other round. stop() is asked
    before every cell: True gives the measurement up (Interrupted), so a caller waits one cell at most."""
    times: dict = {cell: [] for cell in cells}
    for rnd in range(reps + 1):
        for cell in cells if rnd % 2 else cells[::-1]:
            if stop is not None and stop():
                raise Interrupted
            setup(cell)
            t0 = time.perf_counter()
            run(cell)
            if rnd:
                times[cell].append(1000 * (time.perf_counter() - t0))
    return {cell: statistics.median(ts) for cell, ts in times.items()}


def watched(measure_once: Callable[[], dict], tries: int) -> tuple[dict, float | None]:
    """measure_once() up to `tries` times while other processes hold more than BUSY_SHARE of the CPUs; the
    attempt they disturbed least, and the share they took during it (None: the platform does not say)."""
    best: tuple[dict, float | None] | None = None
    for _ in range(max(tries, 1)):
        with OtherLoad() as load:
            ms = measure_once()
        if best is None or (load.share or 0.0) < (best[1] or 0.0):
            best = (ms, load.share)
        if not load.busy:
            break
    return best


def busy(share: float | None) -> bool:
    return share is not None and share > BUSY_SHARE


def _monotone(row: list[float]) -> list[float]:
    """t(S) = min over S' >= S: more new tokens never take less time; noise only adds."""
    return [min(row[i:]) for i in range(len(row))]


def clamp_contexts(contexts: Sequence[int], max_len: int, widths: Sequence[int]) -> list[int]:
    """The contexts a profile can be measured at in a session of max_len positions: one past what the
    buffers hold is measured at the largest that fits (never dropped: an empty profile answers nothing)."""
    return sorted({max(0, min(c, max_len - max(widths))) for c in contexts})


def _at_context(session: ModelSession, slots: Sequence[int], context: int) -> None:
    for s in slots:
        row = session.kv.rows[s]
        row.reset()
        row.advance([0] * context)


# ---------------------------------------------------------------------------------------------- measuring


def measure(
    session: ModelSession,
    widths: Sequence[int] = WIDTHS,
    contexts: Sequence[int] = CONTEXTS,
    reps: int = 3,
    slot: int = 0,
    tries: int = 2,
) -> CostProfile:
    """t(S, context) of one row, in `slot` (what it held is gone: the caller gives a free one)."""
    widths, contexts = list(widths), clamp_contexts(contexts, session.max_len, widths)
    cells = [(c, w) for c in contexts for w in widths]
    ms, share = watched(
        lambda: time_cells(
            cells,
            lambda cell: _at_context(session, [slot], cell[0]),
            lambda cell: session.run_logits([slot], [[0] * cell[1]], [cell[1]]),  # the model alone: logits unread
            reps,
        ),
        tries,
    )
    session.kv.rows[slot].reset()
    return CostProfile(
        machine=machine_signature(session.options),
        settings=settings_key(session.options),
        contexts=contexts,
        widths=widths,
        ms=[_monotone([ms[c, w] for w in widths]) for c in contexts],
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        others_share=None if share is None else round(share, 3),
    )


def measure_batches(
    session: ModelSession,
    batches: Sequence[int],
    widths: Sequence[int] = BATCH_WIDTHS,
    contexts: Sequence[int] = BATCH_CONTEXTS,
    reps: int = BATCH_REPS,
    tries: int = 1,
    stop: Callable[[], bool] | None = None,
) -> BatchProfiles:
    """t(B, S) at each context for a session with at least max(batches) rows (all of them are emptied, also
    when stop() gives the measurement up: Interrupted)."""
    widths, contexts = list(widths), clamp_contexts(contexts, session.max_len, widths)
    batches = [b for b in batches if b <= len(session.kv.rows)]
    cells = [(c, b, w) for c in contexts for b in batches for w in widths]
    try:
        ms, share = watched(
            lambda: time_cells(
                cells,
                lambda cell: _at_context(session, range(cell[1]), cell[0]),
                lambda cell: session.run_logits(list(range(cell[1])), [[0] * cell[2]] * cell[1], [1] * cell[1]),
                reps,
                stop,
            ),
            tries,
        )
    finally:
        for row in session.kv.rows:
            row.reset()
    return BatchProfiles(
        [
            BatchProfile(batches, widths, [_monotone([ms[c, b, w] for w in widths]) for b in batches], c, reps)
            for c in contexts
        ],
        others_share=share,
    )


def step_times(session: ModelSession, context: list[int], widths: Sequence[int], reps: int = 7) -> dict[int, float]:
    """Median ms of one forward of S new (real) tokens after the real `context` in slot 0, for each S that
    fits (the benchmark's measured step costs at a prompt). Slot 0 is left empty."""
    row = session.kv.rows[0]
    row.reset()
    session.run_logits([0], [context], [1])
    base = row.length
    widths = [s for s in widths if base + s <= session.max_len]

    def run(s: int) -> None:
        session.run_logits([0], [(context * (s // max(len(context), 1) + 1))[:s]], [s])

    out = time_cells(widths, lambda s: row.truncate(base), run, reps)
    row.reset()
    return {s: out[s] for s in widths}


# ---------------------------------------------------------------------------------------------- storage


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


def settings_key(options: SessionOptions) -> str:
    return f"t{options.intra_op_threads}-{spin_mode(options)}"


def spin_mode(options: SessionOptions) -> str:
    """spin (during and between runs), spin-run (during runs only) or nospin."""
    if not options.allow_spinning:
        return "nospin"
    return "spin" if options.spin_between_runs else "spin-run"


def profile_path(bundle: Path, profile: CostProfile) -> Path:
    return Path(bundle) / PROFILE_DIR / f"{_key(profile.machine)}-{profile.settings}.json"


def _write(path: Path, data: dict) -> Path | None:
    """Write into the bundle, atomically (a process killed while writing leaves the old file or none, never
    half a file); a read-only bundle just keeps the profile in memory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return path


def save_profile(bundle: Path, profile: CostProfile, even_if_busy: bool = False) -> Path | None:
    """Store the profile in the bundle (None: not stored: the bundle is read-only, or the profile was measured
    while other processes held the CPUs and `even_if_busy` is not set)."""
    if busy(profile.others_share) and not even_if_busy:
        return None
    return _write(profile_path(bundle, profile), asdict(profile))


def load_profile(bundle: Path, options: SessionOptions) -> CostProfile | None:
    """The profile for this machine, preferring the same settings; None if the machine was never profiled."""
    folder = Path(bundle) / PROFILE_DIR
    machine = _key(machine_signature(options))
    exact = folder / f"{machine}-{settings_key(options)}.json"
    candidates = [exact] + sorted(folder.glob(f"{machine}-*.json")) if folder.is_dir() else []
    for path in candidates:
        if path.is_file() and not path.name.endswith("-batch.json"):
            try:
                profile = CostProfile(**json.loads(path.read_text()))
            except (ValueError, TypeError, RecursionError):
                continue
            if well_formed(profile):
                return profile
    return None


def profile_for(session: ModelSession, max_width: int, context: int, slot: int = 0) -> CostProfile:
    """The cached profile of this session's machine, or a quick one measured now in `slot` (and cached)."""
    found = load_profile(session.bundle.path, session.options)
    if found is not None and max(found.widths) >= max_width:
        return found
    quick = measure(
        session, widths=list(range(1, max_width + 1)), contexts=[max(context, 1)], reps=2, slot=slot, tries=1
    )
    # Saved under a name of its own ("...-quick"), so that `specrt inspect` tells it from a full one and a
    # full profile of the same settings, once measured, is the one loaded.
    quick.settings += "-quick"
    save_profile(session.bundle.path, quick)
    return quick


def batch_profile_path(session: ModelSession) -> Path:
    name = f"{_key(machine_signature(session.options))}-{settings_key(session.options)}-batch.json"
    return session.bundle.path / PROFILE_DIR / name


def stored_batch_profile(session: ModelSession) -> BatchProfiles | None:
    """The bundle's t(B, S) for this machine and settings, if a current one is stored (an older file: one
    context, fewer timed rounds, too few rows; or a damaged one, counts as none)."""
    path, slots = batch_profile_path(session), len(session.kv.rows)
    try:
        found = BatchProfiles([BatchProfile(**p) for p in json.loads(path.read_text())["profiles"]])
        first = found.profiles[0]
        wide_enough = max(first.batches) >= min(slots, max(BATCHES)) and first.widths == list(BATCH_WIDTHS)
        contexts = clamp_contexts(BATCH_CONTEXTS, session.max_len, BATCH_WIDTHS)
        current = found.reps >= BATCH_REPS and [p.context for p in found.profiles] == contexts
        if well_formed(found) and wide_enough and current:
            return found
    except (OSError, ValueError, TypeError, KeyError, IndexError, RecursionError):
        pass
    return None


def session_batches(session: ModelSession) -> list[int]:
    """The batch sizes a session's t(B, S) is measured at: BATCHES up to its rows, and its rows."""
    slots = len(session.kv.rows)
    return sorted({b for b in BATCHES if b <= slots} | {slots})


def batch_profile_for(session: ModelSession) -> BatchProfiles:
    """t(B, S) at the measured context lengths for this session's bundle on this machine: the stored one, or
    measured now over all of the session's slots (the caller makes sure none holds a running sequence) and
    saved (when measured on a quiet machine)."""
    found = stored_batch_profile(session)
    if found is None:
        found = measure_batches(session, session_batches(session))
        save_batch_profile(session, found)
    return found


def batch_estimate(session: ModelSession, step: CostProfile) -> BatchProfiles:
    """A stand-in t(B, S) for this session's batch from one row's profile (BatchProfiles.from_row)."""
    contexts = clamp_contexts(BATCH_CONTEXTS, session.max_len, BATCH_WIDTHS)
    return BatchProfiles.from_row(step, session_batches(session), BATCH_WIDTHS, contexts)


def save_batch_profile(session: ModelSession, found: BatchProfiles, even_if_busy: bool = False) -> Path | None:
    """Store t(B, S) in the bundle, as save_profile does a profile (None: not stored)."""
    if busy(found.others_share) and not even_if_busy:
        return None
    return _write(batch_profile_path(session), {"profiles": [asdict(p) for p in found.profiles]})
