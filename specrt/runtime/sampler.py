"""The bundle's sampler graphs in ONNX Runtime: draft picks and verification on the device the logits are on.

`GraphSampler` runs the four graphs the exporter writes into every bundle (specrt/export/sampler.py says what
each computes) on a model session's device, reading the logits from the buffer the model run left them
in. The draft's warped distributions q stay there too, in `q_store` [slots, steps, vocab] (one row per KV
slot, one entry per draft position), written in place by each sampled pick and read by the sampled
verification. What the host sends is O(rows x k) settings, ids and uniforms; what it reads back is ids,
accepted counts and the draft's confidences. A draft on a device of its own has a sampler of its own
there; the target's sampled verification then reads the verified slots' q from it (`QRows`: one block,
copied device to device by ONNX Runtime), the only thing besides ids that crosses. This module runs graphs;
the uniforms, and what the numbers mean for a request, are the engine's business.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..bundle.loading import Bundle
from ..errors import BundleError
from .buffers import DeviceBuffer, HostArrays, Logits, Transfers
from .providers import inference_session, misplaced, placements
from .session import SessionOptions

GRAPHS = ("pick_greedy", "pick_sampled", "pick_filtered", "verify_greedy", "verify_sampled", "verify_filtered")
FOLDER = "sampler"
POOLED_FROM = 1 << 18  # logits elements from which a run uses the engine's threads (below: the caller's)
CANDIDATES = 256  # top-p's first candidate set (specrt.decoding.sampling.TOP_P_CANDIDATES), x8 while short


@dataclass(frozen=True)
class Settings:
    """Per row: whether it is greedy, and its warp (ignored for greedy rows)."""

    greedy: np.ndarray  # bool [R]
    temperature: np.ndarray  # float32 [R] (1 for greedy rows)
    top_k: np.ndarray  # int64 [R]
    top_p: np.ndarray  # float32 [R]

    def repeat(self, counts: list[int]) -> Settings:
        """The same settings per position (row i's for each of its counts[i] positions)."""
        c = np.asarray(counts)
        return Settings(*(np.repeat(a, c) for a in (self.greedy, self.temperature, self.top_k, self.top_p)))

    @cached_property
    def filtered(self) -> bool:
        """Some sampled row uses top-k or top-p (the graphs without them skip that work)."""
        return bool(((self.top_k > 0) | (self.top_p < 1)).any())

    def inputs(self, per_position: Settings | None = None) -> dict[str, np.ndarray]:
        """The warp inputs of a sampled graph: temperature, and top_k / top_p when filtered."""
        s = per_position or self
        out = {"temperature": s.temperature}
        return out | ({"top_k": s.top_k, "top_p": s.top_p} if self.filtered else {})


@dataclass(frozen=True)
class QRows:
    """Slots [lo, lo + shape[0]) of a sampler's q_store: the region a verification on another device reads
    (one contiguous block: [slots, steps, vocab] is slot-major)."""

    buffer: DeviceBuffer
    lo: int
    shape: tuple[int, int, int]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * 4


@functools.cache
def block(vocab: int) -> np.ndarray:
    """The argmax and sampling block (specrt.decoding.sampling.block_size): the graphs read rows in blocks."""
    out = np.array([math.gcd(vocab, 128)], np.int64)
    out.flags.writeable = False  # shared by every run
    return out


def has_samplers(bundle: Bundle) -> bool:
    names = {f.name for f in bundle.manifest.files}
    return all(f"{FOLDER}/{g}.onnx" in names for g in GRAPHS)


class GraphSampler:
    def __init__(self, bundle: Bundle, options: SessionOptions, slots: int, transfers: Transfers):
        if not has_samplers(bundle):
            raise BundleError(
                f"{bundle.path}: no sampler graphs (exported before they existed); re-export the bundle, or add "
                f"them in place: specrt upgrade {bundle.path}"
            )
        self.options, self.transfers, self.slots = options, transfers, slots
        self.sessions: dict = {}
        self._io: dict = {}
        self._host: dict = {}  # (graph, pooled) -> its IO binding's host arrays
        self._picks: dict = {}  # (graph, lo, hi) -> ChainPicks
        for name in GRAPHS:
            self.swap(name, str(bundle.path / FOLDER / f"{name}.onnx"))
        self.q_store = DeviceBuffer(options.device, options.device_id, transfers)
        self.steps = 0  # draft positions q_store holds per slot
        self.vocab = 0
        self.seconds = 0.0  # inside ONNX Runtime, since load
        self.reruns = 0  # top-p candidate sets widened

    # ------------------------------------------------------------------ plumbing

    def swap(self, name: str, model):
        """Run `model` (a path, serialised ONNX, or what `swap` returned) as graph `name` from now on; returns
        what it replaces. The bundle's graphs are loaded this way; the tests swap in deliberately broken rules
        through it. Each graph gets two sessions: one on the caller's thread for small runs (waking a pool
        costs more than the run: a 4-token generation of an 8-token vocabulary took 5.0 ms with pooled
        sampler sessions, 2.2 ms without), and one with the engine's threads for runs over many logits."""

        old = self.sessions.get(name)
        if isinstance(model, tuple):
            self.sessions[name] = model
        else:
            self.sessions[name] = tuple(self._session(model, threads) for threads in (1, self.options.intra_op_threads))
        self._io[name] = tuple(s.io_binding() for s in self.sessions[name])
        self._host = {key: v for key, v in self._host.items() if key[0] != name}
        self._picks = {key: v for key, v in self._picks.items() if key[0] != name}
        return old

    def _session(self, model, threads: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        # Its threads sleep when a run ends: spinning ones would take the cores from the model's next run.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        o = self.options
        session = inference_session(model, so, o.device, o.device_id, o.tf32)
        fallen = misplaced(placements(session), o.device) if o.device != "cpu" else []
        if fallen:  # as for the model graphs: a silent copy of the logits across the bus every run otherwise
            where = f"{o.device}:{o.device_id}"
            raise BundleError(
                f"sampler graph {model if isinstance(model, str) else '(in memory)'}: {len(fallen)} compute nodes "
                f"would run on the CPU beside {where} ({', '.join(fallen[:4])}): this onnxruntime has no {where} "
                "kernel for them; run with --device cpu, or load(sampler='host')"
            )
        return session

    def ensure_steps(self, steps: int, vocab: int) -> None:
        """q_store holds at least `steps` draft positions per slot (reallocated, zeroed, when it grows)."""
        if steps <= self.steps and vocab == self.vocab:
            return
        self.steps = max(steps, 2 * self.steps if steps > self.steps else self.steps, 1)
        self.vocab = vocab
        self.q_store.allocate(self.slots * self.steps * vocab)  # a new layout: start from zeros

    def _q_shape(self) -> tuple[int, int, int]:
        return self.slots, self.steps, self.vocab

    def q_rows(self, lo: int, hi: int, used: int) -> QRows:
        """The q of slots [lo, hi), for a verification by the sampler of another device (`verify`'s q). One
        slot: its first `used` draft positions only (contiguous); more: every position of each (the block's
        stride is the store's)."""
        steps = max(used, 1) if hi - lo == 1 else self.steps
        return QRows(self.q_store, lo, (hi - lo, steps, self.vocab))

    def _run(
        self,
        name: str,
        logits: Logits,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, tuple],
        q: QRows | None = None,
    ):
        """Run graph `name` on `logits` with the host `inputs`; `outputs` names each output's (dtype, shape).
        Returns the outputs as fresh host arrays. The output arrays are bound once per shape (binding costs
        host time on every run); the device buffers skip a binding they already have themselves. q: the
        q_store region a verification reads instead of this sampler's own (another device's)."""
        pooled = int(logits.positions * logits.vocab > POOLED_FROM)
        io = self._io[name][pooled]
        host = self._host.get((name, pooled)) or self._host.setdefault((name, pooled), HostArrays(io))
        for key, array in inputs.items():
            host.set(key, array)
        self.transfers.sent(*inputs.values())
        logits.buffer.bind_input(io, "logits", logits.shape)  # device buffers rebind only when changed
        if q is not None:  # read across: ONNX Runtime copies the region to this session's device each run
            q.buffer.bind_input(io, "q_store", q.shape, q.lo * q.shape[1] * q.shape[2])
            self.transfers.crossed(q.nbytes)
        elif name not in ("pick_greedy", "verify_greedy"):
            self.q_store.bind_input(io, "q_store", self._q_shape())
        if name.startswith("pick_") and name != "pick_greedy":  # the same buffer as output: ScatterND writes
            self.q_store.bind_output(io, "q_store_out", self._q_shape())
        bound = {key: host.output(key, *spec) for key, spec in outputs.items()}
        t0 = time.perf_counter()
        self.sessions[name][pooled].run_with_iobinding(io)
        self.seconds += time.perf_counter() - t0
        out = {key: array.copy() for key, array in bound.items()}
        self.transfers.received(*out.values())
        return out

    def _widening(
        self, name: str, logits: Logits, inputs: dict, outputs: dict, q: QRows | None = None
    ) -> dict[str, np.ndarray]:
        """Run; while a row's top-p mass lies beyond the candidates, run again with eight times as many."""
        if "short" not in outputs:  # no top-p in this run
            return self._run(name, logits, inputs, outputs, q)
        candidates = CANDIDATES
        while True:
            got = self._run(name, logits, {**inputs, "candidates": np.array([candidates], np.int64)}, outputs, q)
            if not got["short"].any() or candidates >= logits.vocab:
                return got
            candidates *= 8
            self.reruns += 1

    def chain_picks(self, lo: int, hi: int, settings: Settings) -> ChainPicks | None:
        """The sampled picks of chained draft steps over slots [lo, hi) with these settings (runtime/chain.py);
        None when a row uses top-p (a row whose candidates fall short must be run again: the host has to look
        between two steps)."""
        if (settings.top_p < 1).any():
            return None
        name = "pick_filtered" if settings.filtered else "pick_sampled"
        picks = self._picks.get((name, lo, hi))
        if picks is None:
            picks = self._picks[name, lo, hi] = ChainPicks(self, name, lo, hi)
        picks.start(settings)
        return picks

    # ------------------------------------------------------------------ the two decisions

    def pick(
        self, logits: Logits, settings: Settings | None, uniforms: np.ndarray | None, slots: list[int], step: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One token per row from a draft step's logits (one position per row): (tokens, confidences). A
        sampled run also stores each row's q at q_store[slot, step]. settings None: every row is greedy."""
        rows = len(slots)
        outputs = {"token": (np.int64, (rows,)), "confidence": (np.float32, (rows,))}
        if settings is None or settings.greedy.all():
            got = self._run("pick_greedy", logits, {"block": block(logits.vocab)}, outputs)
            return got["token"], got["confidence"]
        if step >= self.steps or logits.vocab != self.vocab:
            raise ValueError(f"q_store holds {self.steps} steps of vocab {self.vocab}: call ensure_steps first")
        inputs = settings.inputs() | {
            "block": block(logits.vocab),
            "greedy": settings.greedy,
            "uniform": uniforms.astype(np.float32),
            "q_index": np.array([(slot, step) for slot in slots], np.int64).reshape(rows, 2),
        }
        if settings.filtered:
            outputs["short"] = (np.bool_, (rows,))
        got = self._widening("pick_filtered" if settings.filtered else "pick_sampled", logits, inputs, outputs)
        return got["token"], got["confidence"]

    def verify(
        self,
        logits: Logits,
        drafted: list[list[int]],
        settings: Settings | None,
        lookup: list[bool],
        slots: list[int],
        u_accept: np.ndarray | None,
        u_final: np.ndarray | None,
        q: QRows | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per row (accepted drafts, next token) from the target's verify logits: row i's k_i + 1 positions
        start at logits.starts[i]; its model drafts' q are at q_store[slots[i], 0..k_i), or, given q (the
        draft's sampler on another device), at q's [slots[i] - q.lo, 0..k_i). settings None: every row is
        greedy (no uniforms)."""
        rows = len(drafted)
        k = max(1, max(len(d) for d in drafted))  # a [R, 0] tensor is avoided: padding is never read
        inputs = {
            "block": block(logits.vocab),
            "start": np.array(logits.starts, np.int64),
            "count": np.array([len(d) for d in drafted], np.int64),
            "drafted": np.array([[*d, *[0] * (k - len(d))] for d in drafted], np.int64).reshape(rows, k),
        }
        outputs = {"accepted": (np.int64, (rows,)), "next": (np.int64, (rows,))}
        if settings is None or settings.greedy.all():
            got = self._run("verify_greedy", logits, inputs, outputs)
            return got["accepted"], got["next"]
        if q is None:
            self.ensure_steps(1, logits.vocab)
        inputs |= settings.inputs(settings.repeat(logits.keep)) | {
            "greedy": settings.greedy,
            "lookup": np.array(lookup, np.bool_),
            "q_slot": np.array(slots, np.int64) - (0 if q is None else q.lo),
            "u_accept": np.ascontiguousarray(u_accept[:, :k], np.float32),
            "u_final": u_final.astype(np.float32),
        }
        if settings.filtered:
            outputs["short"] = (np.bool_, (logits.positions,))
        got = self._widening("verify_filtered" if settings.filtered else "verify_sampled", logits, inputs, outputs, q)
        return got["accepted"], got["next"]


class ChainPicks:
    """The sampled picks of chained draft steps over slots [lo, hi): after the model's step j, the pick graph
    reads its logits where the model left them, writes q at q_store[slot, j] and the token and its probability
    to row j of the chain's buffers, from which the model's step j + 1 reads its input ids. One IO binding per
    step position (made once, kept); the settings are written once per chain, step j's uniforms (row j of one
    host array) once per `Chain.run`. Greedy rows among them take the argmax, as in `GraphSampler.pick`."""

    def __init__(self, sampler: GraphSampler, name: str, lo: int, hi: int):
        rows = hi - lo
        self.sampler, self.name, self.lo, self.rows = sampler, name, lo, rows
        self.filtered = name == "pick_filtered"
        self.session = None  # chosen at the first `prepare`, when the vocabulary is known
        self.settings = {
            "temperature": np.ones(rows, np.float32),
            "greedy": np.zeros(rows, np.bool_),
            **({"top_k": np.zeros(rows, np.int64), "top_p": np.ones(rows, np.float32)} if self.filtered else {}),
        }
        self.constants = {"candidates": np.array([CANDIDATES], np.int64)} if self.filtered else {}
        self.uniforms = np.zeros((0, rows), np.float32)  # row j: step j's
        self.q_index = np.zeros((0, rows, 2), np.int64)  # row j: (slot, j) per row
        self.short = DeviceBuffer(sampler.options.device, sampler.options.device_id, sampler.transfers, np.bool_)
        self._ios: list[tuple[object, tuple | None]] = []  # per step position: binding, addresses bound at

    def start(self, settings: Settings) -> None:
        for key, array in self.settings.items():
            np.copyto(array, getattr(settings, key))
        self.sampler.transfers.sent(*self.settings.values())

    def prepare(self, steps: int, logits: DeviceBuffer, tokens: int, confidences: int) -> None:
        """Step positions 0..steps bound: logits from `logits` [rows, vocab], the token and probability of
        position j to device addresses tokens + 8 rows j and confidences + 4 rows j."""
        s, rows, vocab = self.sampler, self.rows, self.sampler.vocab
        if self.session is None:
            pooled = int(rows * vocab > POOLED_FROM)
            self.session = s.sessions[self.name][pooled]
            self.constants["block"] = block(vocab)
        if steps + 1 > len(self.uniforms):  # grown geometrically: every binding moves
            n = max(steps + 1, 2 * len(self.uniforms))
            self.uniforms = np.zeros((n, rows), np.float32)
            self.q_index = np.zeros((n, rows, 2), np.int64)  # [j, row] = (slot, j)
            self.q_index[:, :, 0] = np.arange(self.lo, self.lo + rows)
            self.q_index[:, :, 1] = np.arange(n)[:, None]
            self._ios = [(io, None) for io, _ in self._ios]
        self.short.reserve(rows)
        opts = s.options
        q_shape = s._q_shape()
        # Every binding's addresses and shapes: the logits and q buffers may have moved or grown since.
        at = (tokens, confidences, self.uniforms.ctypes.data, self.short.ptr, logits.ptr, s.q_store.ptr, q_shape)
        while len(self._ios) <= steps:
            self._ios.append((self.session.io_binding(), None))
        for j in range(steps + 1):  # bound once per address set, kept from chain to chain
            io, bound_at = self._ios[j]
            if bound_at != at:
                for key, array in (*self.settings.items(), *self.constants.items()):
                    io.bind_cpu_input(key, array)
                io.bind_cpu_input("uniform", self.uniforms[j])
                io.bind_cpu_input("q_index", self.q_index[j])
                dev = (opts.device, opts.device_id)
                io.bind_output("token", *dev, np.int64, [rows], tokens + 8 * rows * j)
                io.bind_output("confidence", *dev, np.float32, [rows], confidences + 4 * rows * j)
                if self.filtered:
                    self.short.bind_output(io, "short", (rows,))
                logits.bind_input(io, "logits", (rows, vocab))
                s.q_store.bind_input(io, "q_store", q_shape)
                s.q_store.bind_output(io, "q_store_out", q_shape)
                self._ios[j] = (io, at)

    def binding(self, j: int):
        return self._ios[j][0]
