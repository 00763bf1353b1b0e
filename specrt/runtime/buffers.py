"""Device buffers, bound host arrays and the transfer counter: what lives where a model runs, and every byte
that crosses.

`DeviceBuffer` is one float32 buffer on a session's device (host memory for the CPU provider, GPU memory for
CUDA), allocated zeroed, grown geometrically when a run needs more, and bound at its base pointer with any
shape that fits: a model's logits are written into it and a sampler graph reads them from it, with nothing
crossing in between. `HostArrays` keeps the small host arrays an IO binding reads (ids, past lengths,
settings) and writes (ids, counts) bound from run to run, inputs rewritten in place while their shapes hold.
`Transfers` counts the bytes the loop moves: host arrays bound as inputs count as host -> device, arrays
read back into numpy as device -> host. On the CPU provider "device" memory is host memory, and the same
accounting applies to what the loop reads into numpy, so the counter shows on a CPU exactly what would
cross a PCIe bus on a GPU.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np


class HostArrays:
    """The host arrays one IO binding reads (ids, past lengths, settings) and writes (ids, counts), kept bound
    from run to run.

    Binding costs host time on every run (ONNX Runtime builds a tensor and checks it against the graph:
    ~40 us per input right after a 0.5B model's run has flushed the caches, on this machine, against ~6 us
    for the whole unbound loop). An input whose shape and type did not change since the last run is written
    into the array already bound instead (ONNX Runtime reads a bound CPU array in place at run time), so a
    draft step after the first of a round binds nothing; an output array is bound once per shape and type,
    and ONNX Runtime writes each run's result into it (copied from the device where the graph ran), or an
    output the host does not want is bound to device memory, again only when that changes."""

    def __init__(self, io):
        self.io = io
        self.inputs: dict[str, np.ndarray] = {}
        self.outputs: dict[str, tuple] = {}  # name -> (where it is bound, the host array or None)
        self._block: tuple[tuple, np.ndarray] | None = None  # the int64 inputs bound as views of one array

    def set(self, name: str, array: np.ndarray) -> None:
        old = self.inputs.get(name)
        if old is not None and old.shape == array.shape and old.dtype == array.dtype:
            np.copyto(old, array)
            return
        array = np.array(array, copy=True, order="C")  # owned here: the caller may reuse its own
        self.io.bind_cpu_input(name, array)
        self.inputs[name] = array
        self._block = None  # a view of it may be what this name was bound to

    def set_constant(self, name: str, array: np.ndarray) -> None:
        """Bind `array` itself, an array nobody writes (a module's constant): once, while it stays bound."""
        if self.inputs.get(name) is not array:
            self.io.bind_cpu_input(name, array)
            self.inputs[name] = array
            self._block = None

    def set_int64(self, parts: tuple[tuple[str, tuple[int, ...]], ...], values: list[int]) -> np.ndarray:
        """Several int64 inputs, (name, shape) in `parts`, from one flat list of values: the inputs are views
        of one host array, bound while their shapes hold, and a run writes them all with one numpy call
        (each numpy call right after a model's run costs 10-40 us of cold caches). Returns that array."""
        if self._block is None or self._block[0] != parts:
            block = np.zeros(sum(math.prod(shape) for _, shape in parts), np.int64)
            at = 0
            for name, shape in parts:
                view = block[at : at + math.prod(shape)].reshape(shape)
                self.io.bind_cpu_input(name, view)
                self.inputs[name] = view
                at += view.size
            self._block = (parts, block)
        block = self._block[1]
        block[:] = values
        return block

    def output(self, name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The host array bound as output `name`: the next run writes into it (read it before the one after)."""
        key = ("cpu", np.dtype(dtype), tuple(shape))
        bound = self.outputs.get(name)
        if bound is None or bound[0] != key:
            out = np.empty(shape, dtype)
            self.io.bind_output(name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
            bound = self.outputs[name] = (key, out)
        return bound[1]

    def output_on_device(self, name: str, device: str, device_id: int, dtype, shape: tuple[int, ...], ptr: int):
        """Output `name` left on the device at `ptr` (nothing crosses); bound anew only when that changes."""
        key = (device, device_id, np.dtype(dtype), tuple(shape), ptr)
        if self.outputs.get(name, (None,))[0] != key:
            self.io.bind_output(name, device, device_id, np.dtype(dtype), list(shape), ptr)
            self.outputs[name] = (key, None)


# What each IO binding has bound, by name, whichever buffer bound it: two buffers bind the same name of one
# binding in turn (a sampler graph reads the logits of a plain run from the session's buffer and those of a
# padded CUDA-graph run from the graphs' buffer), so a buffer's own memory of its bindings would go stale.
_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Transfers:
    """Bytes moved between the host and a device, since load (shared by an engine's sessions)."""

    to_device: int = 0
    to_host: int = 0
    # Between the draft's device and the target's, when each has its own (`--draft-device`): what a sampled
    # verification reads of the draft's q. Counted wherever the two are apart, on one CPU too.
    across: int = 0

    def sent(self, *arrays: np.ndarray) -> None:
        self.to_device += sum(a.nbytes for a in arrays)

    def received(self, *arrays: np.ndarray) -> None:
        self.to_host += sum(a.nbytes for a in arrays)

    def crossed(self, nbytes: int) -> None:
        self.across += nbytes


class DeviceBuffer:
    """A zeroed float32 buffer of at least `capacity` elements on (device, device_id), grown on demand."""

    def __init__(self, device: str, device_id: int, transfers: Transfers, dtype=np.float32):
        self.device, self.device_id, self.transfers = device, device_id, transfers
        self.dtype = np.dtype(dtype)
        self.capacity = 0
        self._value = None  # the OrtValue
        self._ptr: int | None = None  # its address (asked for at every binding check)
        self._host: np.ndarray | None = None  # the CPU provider's backing array

    def reserve(self, elements: int) -> None:
        """At least `elements`, growing geometrically (what was stored is not kept)."""
        if elements > self.capacity:
            self.allocate(max(elements, 2 * self.capacity))

    def allocate(self, elements: int) -> None:
        """A fresh zeroed buffer of exactly `elements`."""
        import onnxruntime as ort

        if self.device == "cpu":
            self._host = np.zeros(elements, self.dtype)
            self._value = ort.OrtValue.ortvalue_from_numpy(self._host)
        else:  # uninitialised device memory holds anything, NaN included: zero it once
            self._value = ort.OrtValue.ortvalue_from_numpy(np.zeros(elements, self.dtype), self.device, self.device_id)
        self.capacity = elements
        self._ptr = self._value.data_ptr()

    @property
    def ptr(self) -> int | None:
        return self._ptr

    def bind_output(self, io, name: str, shape: tuple[int, ...]) -> None:
        self.reserve(math.prod(shape))
        self._bind(io, name, tuple(shape), io.bind_output)

    def bind_input(self, io, name: str, shape: tuple[int, ...], offset: int = 0) -> None:
        """Bound from element `offset` on: a session on another device copies just that region in (ONNX
        Runtime copies an input bound on a device other than its nodes' before the run)."""
        self._bind(io, name, tuple(shape), io.bind_input, offset)

    def _bind(self, io, name: str, shape: tuple[int, ...], bind, offset: int = 0) -> None:
        """Bind unless `io` already has this memory, with this shape, under `name`: binding costs host time on
        every run, and the same binding is asked for run after run."""
        ptr = self._ptr + offset * self.dtype.itemsize
        key = (self.device, self.device_id, self.dtype, shape, ptr)
        bound = _BOUND.get(io)
        if bound is None:
            bound = _BOUND[io] = {}
        elif bound.get(name) == key:
            return
        bind(name, self.device, self.device_id, self.dtype, list(shape), ptr)
        bound[name] = key

    def read(self, shape: tuple[int, ...], start: int = 0) -> np.ndarray:
        """prod(shape) elements from `start` as a host array (a view on the CPU provider, a copy elsewhere),
        counted as device -> host."""
        size = math.prod(shape)
        if self._host is not None:
            out = self._host[start : start + size].reshape(shape)
            self.transfers.received(out)
            return out
        whole = self._value.numpy()  # the Python API copies a device OrtValue whole: count what crossed
        self.transfers.received(whole)
        return whole[start : start + size].reshape(shape)

    def write(self, start: int, values) -> None:
        """Elements [start, start + len(values)) from the host, counted as host -> device."""
        values = np.asarray(values, self.dtype)
        self.transfers.sent(values)
        if self._host is not None:
            self._host[start : start + values.size] = values
            return
        whole = self._value.numpy()  # the Python API writes a device OrtValue whole (small buffers only)
        whole[start : start + values.size] = values
        self._value.update_inplace(whole)


@dataclass
class Logits:
    """A run's logits left where the model wrote them: [positions, vocab] in `buffer`; row i of the run owns
    positions [starts[i], starts[i] + keep[i]). `tokens` / `confidences`: each position's greedy token and
    its probability, when the run asked its graph for them (ModelSession.run_logits' `top`)."""

    buffer: DeviceBuffer
    positions: int
    vocab: int
    starts: list[int]
    keep: list[int]
    tokens: list[int] | None = None
    confidences: list[float] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.positions, self.vocab

    def rows(self) -> list[np.ndarray]:
        """Each row's logits on the host [keep_i, vocab] (reads the whole run back: the numpy path)."""
        out = self.buffer.read(self.shape)
        return [out[s : s + k] for s, k in zip(self.starts, self.keep, strict=True)]
