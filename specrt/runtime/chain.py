"""Chained draft steps: a round's draft steps over a range of rows, each step's input the pick of the step
before, bound in place on the session's device and run back to back.

A round's first draft step feeds each row the 1-2 tokens its draft slot lacks (ragged); every later step
feeds it the token the step before picked. The rows drafting span a slot range [lo, hi); a slot inside it
that does not draft now runs idle, as in any batched run (what it computes is dropped). When every row is
greedy, the model graph's `top_token` output of step j IS the `input_ids` of step j + 1: both are bound
to row j of one [steps + 1, rows] token buffer on the device, in one IO binding per step position, made once
(with the slot range's KV buffers, as `ModelSession` binds them) and kept. Each binding has its own write
positions, set for the whole chain when it starts, so between two runs the host does nothing: a chain of
n steps is n `run_with_iobinding` calls in a row, then one read of the n steps' tokens and probabilities
(12 B per row and step: the proposal needs them, and the early stop reads them step by step). The first
step's ids (the 1-2 per row) are the only ids sent.

When some row samples, each model step is followed by the sampler's pick graph (runtime/sampler.py
`ChainPicks`), bound the same way: it reads the step's logits where the model left them, keeps q on the
device and writes the step's token row, which the next model step reads; the host sends each step's
uniforms (4 B per row) with the run. Rows with top-p do not chain (a short candidate set is run again, which
needs the host between two steps).

Why: each model run streams the weights through the caches, and whatever the host does next runs cold
(docs/only-ids-cross.md measured 10-40 us for a single small numpy call right after a 0.5B draft's run);
what is not done between runs costs nothing. On the CPU provider "on the device" is host memory, an output
and the next run's input sharing a pointer; on a GPU the same bindings keep the ids there. This module runs
a draft model's steps; what a token means for a request is the engine's business.
"""

from __future__ import annotations

import time

import numpy as np

from .buffers import DeviceBuffer

_TOP_BOTH = 2  # the graph's top_mode: the greedy token and its probability
FEED = 2  # the most ids a row feeds in a chain's first step (the engine catches a draft slot up to this)


class Chain:
    """Chained draft steps over slots [lo, hi) of one `ModelSession` (made by `ModelSession.chain`)."""

    def __init__(self, session, lo: int, hi: int):
        self.session, self.lo, self.hi = session, lo, hi
        rows = hi - lo
        opts = session.options
        self.tokens = DeviceBuffer(opts.device, opts.device_id, session.transfers, np.int64)
        self.confidences = DeviceBuffer(opts.device, opts.device_id, session.transfers, np.float32)
        self.ones = np.ones(rows, np.int64)  # one new token per row, every step after the first
        self.arange = np.arange(rows, dtype=np.int64)  # the logits rows of a 1-token step
        self.top_mode = np.array([_TOP_BOTH], np.int64)
        # The host inputs of a chain, one int64 array written with one numpy call per chain (each call right
        # after a model run costs 10-40 us): [first step's ids [rows, w] (room for w = FEED) | write positions
        # | counts | logits rows | T | per step position 1, 2, ...: its write positions (a row of `rows`) and
        # its T (the attended length, for graphs that take it from the host)].
        self._host = np.zeros(0, np.int64)
        self._host_at = 0  # its address (numpy's is slow to ask for)
        # The first step per width w (1 or 2 ids per row) and each later step position j >= 1: its IO binding
        # and the addresses it was bound at.
        self._first: dict[int, tuple[object, tuple | None]] = {}
        self._ios: list[tuple[object, tuple | None]] = []
        self._width = 1  # this chain's first-step width
        self._past: list[int] = []  # the slots' lengths after the first step
        self._step = 0  # steps run since `start`
        self._ready = 0  # step positions bound and given their write positions since `start`
        self._room = 0  # steps the slots had room for at `start`
        self._fed: list[list[int]] = []  # what the next step feeds each row
        self.picks = None  # the sampler's ChainPicks of this chain, if it samples
        self.live: list[int] | None = None  # the rows that draft, by index in the range (None: all of them)

    def start(self, feeds: list[list[int] | None], steps: int = 1, picks=None) -> None:
        """Begin a chain whose first step feeds row i `feeds[i]` (1-2 ids, slot order) after what its slot
        holds; None: an idle row (a slot in the range not drafting now: it is run on token 0 and its results
        are neither returned nor kept: its slot's length does not move, and what the run wrote past it is
        written again before it is ever read). `steps`: how many steps are expected (bound now; more are
        added when asked for). picks: the sampler's `ChainPicks` when some row samples (each model step is
        then followed by its pick graph's run, which writes the step's tokens); None: the model's own greedy
        picks."""
        rows = self.hi - self.lo
        if len(feeds) != rows or not all(f is None or 1 <= len(f) <= FEED for f in feeds):
            raise ValueError(f"a chain over slots [{self.lo}, {self.hi}) needs 1-{FEED} ids or None for each of {rows}")
        live = [i for i, f in enumerate(feeds) if f is not None]
        if not live:
            raise ValueError(f"a chain over slots [{self.lo}, {self.hi}) needs a row that drafts")
        self.live = None if len(live) == rows else live
        feeds = [[0] if f is None else f for f in feeds]
        kv = self.session.kv.rows
        past = [kv[s].length for s in range(self.lo, self.hi)]
        counts = [len(f) for f in feeds]
        self._width = width = max(counts)
        self._past = [p + c for p, c in zip(past, counts, strict=True)]
        self._step = 0
        self._room = self.session.kv.max_len - max(past) - (FEED - 1)
        self._fed = [list(f) for f in feeds]
        self.picks = picks
        self.top_mode[0] = 0 if picks is not None else _TOP_BOTH  # bound: read in place at each run
        ready = max(min(steps, self._room) - 1, 0)
        self._bind(ready)
        values = []  # ids padded with token 0 (its outputs are never read), then the per-row inputs
        for f in feeds:
            values += f
            values += [0] * (width - len(f))
        values += [0] * ((FEED - width) * rows)
        values += past
        values += counts
        values += [r * width + c - 1 for r, c in enumerate(counts)]  # each row's last fed position
        values.append(self._attend(0))
        for j in range(ready):  # step position j + 1 writes one position past the one before
            values += [p + j for p in self._past]
            values.append(self._attend(j + 1))
        self._host[: len(values)] = values
        self._ready = ready
        self.session.transfers.to_device += 8 * (rows * (width + 3) + 1)  # the first step's (later: per run)

    def _attend(self, j: int) -> int:
        """Step position j's T: every row's end after it (j >= 1 writes one position past the one before)."""
        return self.session.attend(max(self._past) + j)

    @property
    def drafting(self) -> int:
        """How many of the chain's rows draft (the others are idle)."""
        return self.hi - self.lo if self.live is None else len(self.live)

    def room(self) -> int:
        """Steps the slots have room for, from where the chain stands (a step writes <= FEED positions a row)."""
        return self._room - self._step

    def run(self, n: int, uniforms: np.ndarray | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """The next n steps of every row, back to back (each feeding the picks of the one before); then the
        picks of each step and their probabilities: ([step][row] tokens, [step][row] probabilities).
        uniforms [n, rows]: each step's uniforms for a sampled chain's picks."""
        s, rows, j = self.session, self.hi - self.lo, self._step
        if n < 1 or n > self.room():
            raise ValueError(f"{n} steps do not fit slots [{self.lo}, {self.hi}) ({self.room()} positions left)")
        if j + n - 1 > self._ready:  # positions past those made ready at `start` (no work per step otherwise)
            self._extend(j + n - 1)
        ios = [io for io, _ in self._ios[max(j - 1, 0) : j + n - 1]]  # step positions j.. (1.. after the first)
        if j == 0:
            ios.insert(0, self._first[self._width][0])
        run, options = s.session.run_with_iobinding, s.run_options
        if self.picks is None:
            t0 = time.perf_counter()
            for io in ios:  # nothing else between two runs: the caches a run flushed are not touched
                run(io, options)
            s.seconds += time.perf_counter() - t0
        else:
            self._run_sampled(ios, j, uniforms)
        s.chained_steps += n
        s.transfers.to_device += 8 * (rows + 1) * (n - (j == 0))  # each later step's write positions and T
        tokens = self.tokens.read((n, rows), j * rows)
        confidences = self.confidences.read((n, rows), j * rows)
        if self.live is not None:  # the drafting rows' columns only
            tokens, confidences = tokens[:, self.live], confidences[:, self.live]
        tokens, confidences = tokens.tolist(), confidences.tolist()
        live = range(rows) if self.live is None else self.live
        fed = [self._fed[i] for i in live]
        for step in tokens[:-1]:
            for row, token in zip(fed, step, strict=True):
                row.append(token)
        kv = s.kv.rows
        for i, row in zip(live, fed, strict=True):
            kv[self.lo + i].advance(row)
        for i, t in zip(live, tokens[-1], strict=True):
            self._fed[i] = [t]
        self._step = j + n
        return tokens, confidences

    def _extend(self, steps: int) -> None:
        """Step positions up to `steps` bound and given their write positions, past those made ready."""
        self._bind(steps)
        rows = self.hi - self.lo
        blocks = self._host[self._base() :].reshape(-1, rows + 1)
        blocks[self._ready : steps, :rows] = np.array(self._past) + np.arange(self._ready, steps)[:, None]
        blocks[self._ready : steps, rows] = [self._attend(j + 1) for j in range(self._ready, steps)]
        self._ready = steps

    def _base(self) -> int:
        """Where the later step positions' blocks start in the host array."""
        return (self.hi - self.lo) * (FEED + 3) + 1

    def _bind(self, steps: int) -> None:
        """Token and confidence rows 0..steps exist, the first step (this chain's width) writes row 0, and step
        positions 1..steps read row j - 1 and write row j: bound once per set of buffer addresses, kept from
        chain to chain (a general run may have moved the session's logits buffer, where the steps' logits go,
        never read here)."""
        s, rows = self.session, self.hi - self.lo
        if (steps + 1) * rows > self.tokens.capacity:  # grown geometrically; what was written is kept
            kept = self.tokens.read((self._step * rows,)).copy() if self.tokens.capacity else None
            self.tokens.allocate(2 * (steps + 1) * rows)
            self.confidences.allocate(2 * (steps + 1) * rows)
            if kept is not None and kept.size:
                self.tokens.write(0, kept)
        base = self._base()
        if base + steps * (rows + 1) > self._host.size:  # grown likewise, its contents kept
            had = max(self._host.size - base, 0) // (rows + 1)
            grown = np.zeros(base + max(steps, 2 * had) * (rows + 1), np.int64)
            grown[: self._host.size] = self._host
            self._host, self._host_at = grown, grown.ctypes.data
        shape = s._logits_shape(rows)
        s.logits.reserve(rows * s.vocab_size)
        at = (self.tokens.ptr, self.confidences.ptr, self._host_at, s.logits.ptr)
        host, width = self._host, self._width
        io, bound_at = self._first.get(width) or (s._new_binding(self.lo, self.hi), None)
        if bound_at != at:
            w, f = rows * width, rows * FEED
            ids = host[:w].reshape(rows, width)
            first = [host[f + i * rows : f + (i + 1) * rows] for i in range(3)]  # writes, counts, logits rows
            self._bind_step(io, 0, [ids, *first, host[base - 1 : base]])
            s.logits.bind_output(io, s.graph.logits, shape)
        self._first[width] = (io, at)
        while len(self._ios) < steps:
            self._ios.append((s._new_binding(self.lo, self.hi), None))
        for j in range(1, steps + 1):
            io, bound_at = self._ios[j - 1]
            if bound_at != at:
                at_j = base + (j - 1) * (rows + 1)
                writes, attend = host[at_j : at_j + rows], host[at_j + rows : at_j + rows + 1]
                self._bind_step(io, j, [None, writes, self.ones, self.arange, attend])
                s.logits.bind_output(io, s.graph.logits, shape)
                self._ios[j - 1] = (io, at)
        if self.picks is not None:  # after the logits' binding: it may have grown the buffer
            self.picks.prepare(steps, s.logits, self.tokens.ptr, self.confidences.ptr)

    def _run_sampled(self, ios: list, j: int, uniforms: np.ndarray) -> None:
        """Model step, then its pick graph, for each of the steps j.. (the pick writes the token the next model
        step reads); the two sessions' times counted apart, as their separate runs are."""
        picks, s = self.picks, self.session
        n = len(ios)
        if uniforms is None or uniforms.shape != (n, self.hi - self.lo):
            raise ValueError(f"a sampled chain's {n} steps need uniforms [{n}, {self.hi - self.lo}]")
        picks.uniforms[j : j + n] = uniforms
        s.transfers.to_device += uniforms.size * 4
        run, pick, options = s.session.run_with_iobinding, picks.session.run_with_iobinding, s.run_options
        model = sampler = 0.0
        for i, io in enumerate(ios):
            t0 = time.perf_counter()
            run(io, options)
            t1 = time.perf_counter()
            pick(picks.binding(j + i))
            sampler += time.perf_counter() - t1
            model += t1 - t0
        s.seconds += model
        picks.sampler.seconds += sampler

    def _bind_step(self, io, j: int, inputs: list) -> None:
        """Step position j's outputs to token / confidence row j; its ids from row j - 1 (j >= 1) or the first
        step's host array; its write positions, counts and logits rows from `inputs`."""
        s, rows = self.session, self.hi - self.lo
        g, opts = s.graph, s.options
        dev, dev_id = opts.device, opts.device_id
        tokens, confidences = self.tokens.ptr, self.confidences.ptr
        ids, write_index, new_tokens, logits_rows, attend = inputs
        if j:
            io.bind_input(g.input_ids, dev, dev_id, np.int64, [rows, 1], tokens + 8 * rows * (j - 1))
        else:
            io.bind_cpu_input(g.input_ids, ids)
        io.bind_output(g.top_token, dev, dev_id, np.int64, [rows], tokens + 8 * rows * j)
        io.bind_output(g.top_confidence, dev, dev_id, np.float32, [rows], confidences + 4 * rows * j)
        for name, array in (
            (g.write_index, write_index),
            (g.new_tokens, new_tokens),
            (g.logits_rows, logits_rows),
            (g.top_mode, self.top_mode),
            (g.attend_bucket, s.bucket),
            (g.attend_length, attend),
        ):
            if name:
                io.bind_cpu_input(name, array)
