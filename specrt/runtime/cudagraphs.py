"""CUDA graphs for a model's decode and verify runs (`load(cuda_graphs=True)`, `--cuda-graphs`): the shape a run
is padded to, which captured graph it replays, the fixed device buffers it reads and writes, and how many
graphs are kept.

ONNX Runtime's CUDA provider with `enable_cuda_graph` captures a run into a CUDA graph per run option
`gpu_graph_id` and replays it from then on: the same kernels on the same addresses with the same shapes, and
no host work per kernel. A run that may replay a graph therefore has
- the same shapes (`Shape`): its rows are the slots [0, rows) for a batch bucket rows = 1, 2, 4, ... (slots
  that do not run this time run idle, as in any batched run), its width 1 (a decode step) or `max_width`
  (a verify pass: k_max + 1, shorter rows padded), its attended length T a power of two of at least 64
  (sent as the run's `attend_length`), and all rows x width logits
  positions (the real ones first, in the order every run has; the rest repeat the last and are never read);
  `top` (what the run computes beside its logits) picks a branch of the graph, so it is part of the shape;
- the same addresses: its int64 inputs (ids, write positions, new-token counts, logits rows) written from
  the host into one device buffer per shape, bound at fixed offsets; the KV slots of [0, rows) (fixed since
  load); the logits and the greedy picks in buffers sized for the largest shape at the start. T itself
  (`attend_length`) and `top_mode` stay in host memory, as the graph's shape computations read them there.
A run wider than the verify bucket (a prefill chunk), or one whose padding would write past the end of a
slot, runs as usual (`gpu_graph_id` -1), as does every run of a shape past the cap (each graph keeps device
memory for its kernels' intermediates). Every other run of the session passes -1 too: the default id 0
would capture whatever ran first.

The CPU provider ignores the graph ids and runs the padded runs as they are: that is how the bookkeeping
and the padding are tested here (tests/test_cuda_graphs.py: tokens equal to unpadded runs, ids and buffer
addresses per shape, the cap). No capture has run: docs/gpu.md says what to measure on a GPU.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .buffers import DeviceBuffer, Logits

MIN_ATTEND = 64
MAX_WIDTH = 9  # the verify bucket: 1 + GenerationOptions' default max_draft_tokens (wider rounds run as usual)
CAP = 32  # captured shapes per session
TOP_MODES = [np.array([mode], np.int64) for mode in range(3)]  # the top_mode input, by value (never written)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class Shape:
    """A captured run's padded shape."""

    rows: int  # slots [0, rows)
    width: int  # new positions per row
    attend: int  # the attended length T
    top: int  # the graph's top_mode: 0, 1 or 2


def plan(
    hi: int, width: int, lengths: list[int], new: list[int], max_width: int, max_len: int, top: int
) -> Shape | None:
    """The shape a run over slots below `hi` is padded to, or None when it runs as usual. lengths: every
    slot's cached length (all rows of the session), new: the new tokens per slot below `hi`."""
    if width == 1:
        w = 1
    elif width <= max_width:
        w = max_width
    else:
        return None  # a prefill chunk
    rows = min(len(lengths), next_pow2(hi))
    if max(lengths[:rows]) + w > max_len:  # padding writes positions [length, length + w) of every slot
        return None
    counts = new + [0] * (rows - len(new))
    total = max(length + n for length, n in zip(lengths[:rows], counts, strict=True))
    return Shape(rows, w, min(max_len, max(MIN_ATTEND, next_pow2(total))), top)


class Captured:
    """One shape's graph id, IO binding (its own KV slot range bound once) and int64 input block."""

    def __init__(self, graphs: CudaGraphs, shape: Shape, graph_id: int):
        import onnxruntime as ort

        s = graphs.session
        g, rows, width = s.graph, shape.rows, shape.width
        self.shape, self.graph_id, self.runs = shape, graph_id, 0
        self.io = s._new_binding(0, rows)
        self.parts = [
            (g.input_ids, (rows, width)),
            (g.write_index, (rows,)),
            (g.new_tokens, (rows,)),
            (g.logits_rows, (rows * width,)),
        ]
        size = sum(int(np.prod(p)) for _, p in self.parts)
        self.inputs = DeviceBuffer(s.options.device, s.options.device_id, s.transfers, np.int64)
        self.inputs.allocate(size)
        at = 0
        for name, part in self.parts:
            self.inputs.bind_input(self.io, name, part, at)
            at += int(np.prod(part))
        # T on the host: the slices and ranges it sizes read it there, so nothing is copied back from the device
        # while the graph is captured; a replay keeps the captured T, which is the shape's.
        self.attend = np.array([shape.attend], np.int64)
        self.io.bind_cpu_input(g.attend_length, self.attend)
        positions = rows * width
        graphs.logits.bind_output(self.io, g.logits, (positions, s.vocab_size))
        if g.top_mode:
            self.io.bind_cpu_input(g.top_mode, TOP_MODES[shape.top])  # picks the If branch: part of the shape
            graphs.tokens.bind_output(self.io, g.top_token, (positions,))
            graphs.confidences.bind_output(self.io, g.top_confidence, (positions,))
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("gpu_graph_id", str(graph_id))


class CudaGraphs:
    """A session's captured shapes (made on first use, at most `cap`), and its runs through them."""

    def __init__(self, session, max_width: int, cap: int = CAP):
        s = session
        self.session, self.max_width, self.cap = s, max_width, cap
        self.shapes: dict[Shape, Captured] = {}
        self.uncaptured = Counter()  # runs that ran as usual, by why
        most = len(s.kv.rows) * max_width
        # Sized for the largest shape now: a captured graph writes to the addresses it was captured with.
        self.logits = DeviceBuffer(s.options.device, s.options.device_id, s.transfers)
        self.logits.allocate(most * s.vocab_size)
        self.tokens = DeviceBuffer(s.options.device, s.options.device_id, s.transfers, np.int64)
        self.tokens.allocate(most)
        self.confidences = DeviceBuffer(s.options.device, s.options.device_id, s.transfers)
        self.confidences.allocate(most)

    def captured(self, shape: Shape) -> Captured | None:
        """The shape's graph (ids from 1: 0 is ONNX Runtime's default), or None past the cap."""
        c = self.shapes.get(shape)
        if c is None and len(self.shapes) < self.cap:
            c = self.shapes[shape] = Captured(self, shape, len(self.shapes) + 1)
        return c

    def run(self, slots: list[int], ids: list[list[int]], keep: list[int], top: int) -> Logits | None:
        """The run padded to its shape and run with its graph id; None when it is to run as usual (nothing
        done). The caller has checked the rows and advances them after."""
        s = self.session
        lengths = [len(r.ids) for r in s.kv.rows]
        hi = max(slots) + 1
        new = [0] * hi
        for slot, x in zip(slots, ids, strict=True):
            new[slot] = len(x)
        shape = plan(hi, max(new), lengths, new, self.max_width, s.kv.max_len, top)
        if shape is None:
            self.uncaptured["shape"] += 1
            return None
        c = self.captured(shape)
        if c is None:
            self.uncaptured["cap"] += 1
            return None
        rows, width = shape.rows, shape.width
        flat = [0] * (rows * width)
        real = [0] * rows
        out: list[int] = []
        for slot, x, k in zip(slots, ids, keep, strict=True):
            flat[slot * width : slot * width + len(x)] = x
            real[slot] = len(x)
            out.extend(range(slot * width + len(x) - k, slot * width + len(x)))
        padded = out + [out[-1]] * (rows * width - len(out))
        c.inputs.write(0, flat + lengths[:rows] + real + padded)
        s.seconds += s.timed_run(c.io, c.run_options)
        c.runs += 1
        starts = [0, *itertools.accumulate(keep)][:-1]  # no numpy call right after a run: cold caches
        logits = Logits(self.logits, len(out), s.vocab_size, starts, list(keep))
        if top:
            tokens = self.tokens.read((len(out),))
            logits.tokens = tokens.tolist()
            if top >= 2:
                logits.confidences = self.confidences.read((len(out),)).tolist()
        return logits
