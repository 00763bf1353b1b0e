"""One bundle loaded into ONNX Runtime: an InferenceSession, its IO binding and its KV cache.

`ModelSession.run(slots, ids, keep)` appends each row's `ids` to its slot's cached context in one graph run
(prefill, a 1-token decode step and a (k+1)-token verify pass are the same call, for any number of ragged
rows) and returns the logits of each row's last `keep` positions; `forward(ids, keep)` is slot 0 alone.
The KV buffers are bound once as both the graph's past inputs and present outputs, so the graph updates
them in place. This module knows nothing about sampling or speculation.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import numpy as np

from ..bundle.loading import Bundle
from ..errors import BundleError, OptionsError
from . import tensorrt as trt
from .buffers import DeviceBuffer, HostArrays, Logits, Transfers
from .chain import Chain
from .cudagraphs import MAX_WIDTH, TOP_MODES, CudaGraphs
from .kvcache import KV_TYPES, KVCache
from .providers import DEVICES, TENSORRT, inference_session, misplaced, out_of_memory, placements
from .settings import GPU_BUCKET, SessionOptions


def _kv_gib(m, rows: int) -> float:
    """GiB of the key and value buffers of `rows` slots of the bundle's max_seq_len."""
    a = m.architecture
    size = np.dtype(KV_TYPES[m.graph.kv_dtype][0]).itemsize
    return 2 * size * rows * a.num_layers * a.num_kv_heads * m.max_seq_len * a.head_dim / 2**30


def _weights_gib(bundle) -> float:
    return sum(f.stat().st_size for f in bundle.path.glob("model.onnx*")) / 2**30


class ModelSession:
    def __init__(
        self, bundle: Bundle, options: SessionOptions | None = None, rows: int = 1, transfers: Transfers | None = None
    ):
        import onnxruntime as ort

        self.bundle = bundle
        self.transfers = transfers or Transfers()  # an engine shares one between its sessions
        self.options = options = options or SessionOptions()
        m = bundle.manifest
        self.graph = g = m.graph
        self.vocab_size = m.architecture.vocab_size
        if rows < 1 or (rows > 1 and g.flavour != "standard"):
            raise OptionsError(
                f"{bundle.path}: {rows} rows need a bundle of the standard graph (this one is {g.flavour!r}, "
                "batch 1); re-export it with --graph standard"
            )

        if m.dtype == "bf16" and options.device == "cpu":
            raise OptionsError(
                f"{bundle.path}: a bf16 bundle needs a GPU (ONNX Runtime's CPU provider has no bfloat16 kernels); "
                "run it with --device cuda, or export the model with --dtype fp16 for the CPU"
            )
        trt_options = None
        if options.tensorrt:
            why = trt.refusal(bundle)
            if why:
                raise BundleError(why)
            trt_options = trt.options(bundle, options.device_id, rows)
        provider = TENSORRT if options.tensorrt else DEVICES[options.device]
        available = ort.get_available_providers()
        if provider not in available:
            asked = "tensorrt" if options.tensorrt else options.device
            raise OptionsError(
                f"device {asked!r} needs {provider}, which this onnxruntime lacks "
                f"(has {', '.join(available)}); install onnxruntime-gpu: pip install 'specrt[gpu]'"
            )
        so = ort.SessionOptions()
        so.intra_op_num_threads = options.intra_op_threads
        so.inter_op_num_threads = 1  # one graph at a time: the parallelism is inside its operators
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.allow_spinning else "0")
        if not options.spin_between_runs:
            so.add_session_config_entry("session.force_spinning_stop", "1")
        if m.quantization.form == "qdq":  # ORT fuses DequantizeLinear + MatMul into MatMulNBits at this level
            so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(m.quantization.accuracy_level))
        so.log_severity_level = 3
        where = f"{options.device}:{options.device_id}"
        try:
            o = options
            self.session = inference_session(
                str(bundle.model_path), so, o.device, o.device_id, o.tf32, trt_options, o.cuda_graphs
            )
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            if out_of_memory(str(e)):
                raise BundleError(
                    f"{bundle.model_path}: {where} ran out of memory loading the graph ({_weights_gib(bundle):.2f} GiB "
                    f"of weights, then {_kv_gib(m, rows):.2f} GiB of KV slots for {rows} rows); free the device, "
                    "load fewer rows (max_batch) or a bundle with a smaller --max-seq-len or --quant int4"
                ) from None
            raise BundleError(
                f"{bundle.model_path}: ONNX Runtime cannot load the graph ({first}); re-export the bundle"
            ) from None
        fallen = misplaced(placements(self.session), options.device) if options.device != "cpu" else []
        if fallen:
            raise BundleError(
                f"{bundle.model_path}: {len(fallen)} compute nodes would run on the CPU beside {where} "
                f"({', '.join(fallen[:4])}{', ...' if len(fallen) > 4 else ''}): this onnxruntime has no {where} "
                "kernel for them; export with --dtype fp16 (kernels for every node), or run with --device cpu"
            )
        self._check_io()

        arch = m.architecture
        try:
            self.kv = KVCache(
                arch.num_layers,
                arch.num_kv_heads,
                m.max_seq_len,
                arch.head_dim,
                g.kv_dtype,
                options.device,
                options.device_id,
                rows,
            )
        except Exception as e:  # host: MemoryError / ValueError; a device: ONNX Runtime's out-of-memory error
            if not isinstance(e, (MemoryError, ValueError)) and not out_of_memory(str(e)):
                raise
            raise BundleError(
                f"{bundle.path}: cannot allocate the KV buffers ({_kv_gib(m, rows):.1f} GiB for {rows} rows of "
                f"max_seq_len {m.max_seq_len} on {where}: {type(e).__name__}); re-export with a smaller "
                "--max-seq-len, or load fewer rows (max_batch)"
            ) from None
        # One IO binding per slot range, its KV rows bound once: rebinding 4 x layers buffers whenever a run's
        # range changed (draft steps, as rows stop drafting) cost ~1 ms of host time per run on 28 layers.
        self._ios: dict[tuple[int, int], object] = {}
        self._chains: dict[tuple[int, int], Chain] = {}
        self._io = self._bind_rows(0, 1)
        # The logits of every run, on the session's device; read back only by the numpy path.
        self.logits = DeviceBuffer(options.device, options.device_id, self.transfers)
        self._host: dict[int, HostArrays] = {}  # per IO binding (each lives as long as the session)
        # Where the graph's top outputs go when a run does not ask for them.
        self._top_scratch = DeviceBuffer(options.device, options.device_id, self.transfers, np.int64)
        bucket = options.attend_bucket or (1 if options.device == "cpu" else GPU_BUCKET)
        self.bucket_size = bucket  # sent with each run's int64 inputs
        self.bucket = np.array([bucket], np.int64)  # bound as it is by chained steps (never written)
        self.seconds = 0.0  # inside ONNX Runtime (model runs), since load
        self.chained_steps = 0  # draft steps run as a chain (runtime/chain.py), since load
        self.graphs: CudaGraphs | None = None
        self.run_options = None  # every run's but a captured shape's (ONNX Runtime's default)
        if options.cuda_graphs:
            if g.flavour != "standard" or g.masks != "graph" or not g.attend_length:
                raise OptionsError(
                    f"{bundle.path}: CUDA graphs need a bundle of the standard graph whose attended length the "
                    "runtime sends (attend_length); re-export it"
                )
            self.graphs = CudaGraphs(self, MAX_WIDTH)
            self.run_options = ort.RunOptions()
            self.run_options.add_run_config_entry("gpu_graph_id", "-1")  # not 0: that would capture

    def attend(self, total: int) -> int:
        """T for a run whose longest row ends at `total`: rounded up to the bucket, at most the buffer."""
        b = self.bucket_size
        return min(self.kv.max_len, -(-total // b) * b)

    def timed_run(self, io, run_options=None) -> float:
        """One run of the bound graph; its seconds."""
        t0 = time.perf_counter()
        self.session.run_with_iobinding(io, run_options if run_options is not None else self.run_options)
        return time.perf_counter() - t0

    def _bind_rows(self, lo: int, hi: int):
        """The IO binding with slots [lo, hi) of every layer's buffers bound as both the past input and the
        present output (made on first use).

        The same memory on both sides is what makes the update in place (GroupQueryAttention detects the
        shared buffer; TensorScatter, the past input's only consumer, writes into it). Rows are the leading
        dimension, so a slot range is one pointer and a shape: no view objects, on any device."""
        io = self._ios.get((lo, hi))
        if io is None:
            io = self._ios[lo, hi] = self._new_binding(lo, hi)
        return io

    def _new_binding(self, lo: int, hi: int):
        """A fresh IO binding with slots [lo, hi) of every layer's KV buffers bound (see `_bind_rows`)."""
        io = self.session.io_binding()
        g, kv = self.graph, self.kv
        device, device_id = self.options.device, self.options.device_id
        shape = [hi - lo, *kv.shape[1:]]
        for layer, (key, value) in enumerate(kv.layers):
            past_k, past_v, present_k, present_v = g.kv_names(layer)
            for name, buf, bind in (
                (past_k, key, io.bind_input),
                (past_v, value, io.bind_input),
                (present_k, key, io.bind_output),
                (present_v, value, io.bind_output),
            ):
                bind(name, device, device_id, kv.bind_type, shape, buf.data_ptr() + lo * kv.row_nbytes)
        return io

    def chain(self, lo: int, hi: int) -> Chain | None:
        """Chained greedy draft steps over slots [lo, hi) (runtime/chain.py), made once per range; None when
        this bundle's graph cannot chain (no greedy pick among its outputs, or the mask built on the host)."""
        g = self.graph
        if not g.top_mode or g.flavour != "standard" or g.masks != "graph":
            return None
        chain = self._chains.get((lo, hi))
        if chain is None:
            chain = self._chains[lo, hi] = Chain(self, lo, hi)
        return chain

    @property
    def max_len(self) -> int:
        return self.kv.max_len

    def _check_io(self) -> None:
        """The graph must have exactly the inputs and outputs the manifest describes, with the KV buffer and
        logits shapes it states: the runtime sizes buffers from the manifest, so a disagreement would
        otherwise surface as a failed run in the middle of a generation."""
        m, g = self.bundle.manifest, self.graph
        a = m.architecture
        inputs = {i.name: i.shape for i in self.session.get_inputs()}
        outputs = {o.name: o.shape for o in self.session.get_outputs()}
        want_in = set(g.inputs())
        want_out = {g.logits} | ({g.top_token, g.top_confidence} if g.top_mode else set())
        for layer in range(a.num_layers):
            pk, pv, ok, ov = g.kv_names(layer)
            want_in |= {pk, pv}
            want_out |= {ok, ov}
        where = self.bundle.model_path
        missing = sorted(want_in - inputs.keys()) + sorted(want_out - outputs.keys())
        if missing:
            raise BundleError(
                f"{where}: graph lacks {', '.join(missing[:4])} named by the manifest; re-export the bundle"
            )
        extra = sorted(inputs.keys() - want_in)
        if extra:
            raise BundleError(
                f"{where}: graph has inputs the manifest does not describe ({', '.join(extra[:4])}; the manifest "
                f"says {a.num_layers} layers); re-export the bundle"
            )
        kv = [a.num_kv_heads, m.max_seq_len, a.head_dim]
        found = {"KV buffer": (inputs[g.kv_names(0)[0]][1:], kv), "logits": (outputs[g.logits][-1:], [a.vocab_size])}
        for what, (shape, expected) in found.items():
            if list(shape) != expected:
                raise BundleError(
                    f"{where}: the graph's {what} dimensions are {list(shape)} but the manifest says {expected} "
                    "(kv_heads, max_seq_len, head_dim / vocab_size); re-export the bundle"
                )

    def _execute(
        self,
        io,
        inputs: dict[str, np.ndarray],
        positions: int,
        starts: list[int],
        keep: list[int],
        top: int,
        ints: tuple[tuple, list[int]] | None = None,
    ) -> Logits:
        """Bind the host inputs (counted as sent) and the logits buffer, run, and hand back the logits where
        they are, with each logits row's greedy token (top >= 1) and its probability (top 2) where the graph
        computes them (counted as received). ints: int64 inputs as ((name, shape), ...) and one flat list of
        their values (`HostArrays.set_int64`)."""
        g = self.graph
        host = self._host.get(id(io)) or self._host.setdefault(id(io), HostArrays(io))
        if g.top_mode:
            host.set_constant(g.top_mode, TOP_MODES[top])
            self.transfers.to_device += 8
            tokens, confidences = self._bind_top(host, positions, top)
        for name, array in inputs.items():
            host.set(name, array)
        if inputs:
            self.transfers.sent(*inputs.values())
        if ints is not None:
            self.transfers.sent(host.set_int64(*ints))
        self.logits.bind_output(io, g.logits, self._logits_shape(positions))
        self.seconds += self.timed_run(io)
        logits = Logits(self.logits, positions, self.vocab_size, starts, keep)
        if g.top_mode and top:
            self.transfers.received(tokens, confidences)
            logits.tokens = tokens.tolist()
            logits.confidences = confidences.tolist() if top >= 2 else None
        return logits

    def _bind_top(self, host: HostArrays, positions: int, top: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The graph's top outputs bound to host arrays when the run asks for them (they cross), else to a
        scratch buffer on the device (zeros that stay there)."""
        g, opts = self.graph, self.options
        if top:
            return host.output(g.top_token, np.int64, (positions,)), host.output(
                g.top_confidence, np.float32, (positions,)
            )
        self._top_scratch.reserve(2 * positions)  # int64 tokens in the first half, float32 after them
        base = self._top_scratch.ptr
        host.output_on_device(g.top_token, opts.device, opts.device_id, np.int64, (positions,), base)
        host.output_on_device(
            g.top_confidence, opts.device, opts.device_id, np.float32, (positions,), base + 8 * positions
        )
        return None, None

    def _logits_shape(self, positions: int) -> tuple[int, ...]:
        return (1, positions, self.vocab_size) if self.graph.flavour == "gqa" else (positions, self.vocab_size)

    def forward(self, ids: Sequence[int], keep: int = 1) -> np.ndarray:
        """Run `ids` after slot 0's cached context; return logits [keep, vocab] of the last `keep` positions.

        The returned array is reused by the next call with the same `keep`: read it before that call.
        """
        return self.run([0], [ids], [keep])[0]

    def _run_gqa(self, ids: Sequence[int], keep: int, top: int) -> Logits:
        """The batch-1 graph's run (GroupQueryAttention, slot 0): sequence lengths instead of a mask."""
        n, row = len(ids), self.kv.rows[0]
        if n == 0 or not 1 <= keep <= n:
            raise ValueError(f"forward needs 1 <= keep ({keep}) <= len(ids) ({n})")
        total = row.length + n
        if total > self.kv.max_len:
            raise ValueError(f"KV cache overflow: {row.length} + {n} > max_len {self.kv.max_len}")
        g, io = self.graph, self._io
        # Locals keep the host arrays alive until the run is over.
        input_ids = np.asarray(ids, dtype=np.int64).reshape(1, n)
        seqlens_k = np.array([total - 1], np.int32)
        total_len = np.array(total, np.int32)
        keep_arr = np.array([keep], np.int64)
        inputs = {g.input_ids: input_ids, g.seqlens_k: seqlens_k, g.total_sequence_length: total_len}
        logits = self._execute(io, {**inputs, g.logits_to_keep: keep_arr}, keep, [0], [keep], top)
        row.advance(list(ids))
        return logits

    def run(self, slots: Sequence[int], ids: Sequence[Sequence[int]], keep: Sequence[int]) -> list[np.ndarray]:
        """`run_logits`, then each row's logits [keep[i], vocab] read back to the host (the numpy path). The
        returned arrays are views of a buffer the next run reuses."""
        return self.run_logits(slots, ids, keep).rows()

    def run_logits(
        self, slots: Sequence[int], ids: Sequence[Sequence[int]], keep: Sequence[int], top: int = 0
    ) -> Logits:
        """One graph run for several rows (standard graph): slot slots[i] appends ids[i] to its cached
        context; the logits of each row's last keep[i] new positions stay on the device (`Logits`). top: 1
        asks the graph for each of those positions' greedy token too, 2 also for its probability (read back
        as `Logits.tokens` / `confidences`; None where the bundle's graph has no such outputs).

        Rows are ragged: each has its own past length and number of new tokens (padded to the widest). The
        run covers the slot range [min, max] of `slots`; a slot inside it that has no tokens this time is
        carried as an idle row (its padding writes only positions at or past its length, never read before
        they are written again)."""
        if len(slots) != len(ids) or len(ids) != len(keep) or not slots:
            raise ValueError("run needs one list of ids and one keep per slot, and at least one slot")
        if self.graph.flavour != "standard":  # one row: the batch-1 graph's own call
            if list(slots) != [0]:
                raise ValueError(f"a {self.graph.flavour} graph runs slot 0 alone; got slots {list(slots)}")
            return self._run_gqa(ids[0], keep[0], top)
        if len(set(slots)) != len(slots) or min(slots) < 0 or max(slots) >= len(self.kv.rows):
            raise ValueError(f"slots {list(slots)} must be distinct and in [0, {len(self.kv.rows)})")
        # Plain Python over the rows, one numpy array per graph input: this runs up to k + 1 times a round,
        # and per-row numpy calls cost more host time than the bookkeeping they do.
        width = max(len(x) for x in ids)
        lo, hi = min(slots), max(slots) + 1
        rows = self.kv.rows[lo:hi]
        past = [len(r.ids) for r in rows]
        real = [0] * (hi - lo)
        flat = [0] * ((hi - lo) * width)  # padding: token 0, whose outputs are never read
        rows_out: list[int] = []  # each row's last keep[i] real positions, indexed in the flattened [B * S]
        for slot, x, k in zip(slots, ids, keep, strict=True):
            n, r = len(x), slot - lo
            if not x or not 1 <= k <= n:
                raise ValueError(f"slot {slot}: run needs 1 <= keep ({k}) <= new tokens ({n})")
            if past[r] + width > self.kv.max_len:
                raise ValueError(
                    f"KV cache overflow: slot {slot} holds {past[r]}, + {width} > max_len {self.kv.max_len}"
                )
            real[r] = n
            flat[r * width : r * width + n] = x
            rows_out.extend(range(r * width + n - k, r * width + n))
        g = self.graph
        if self.graphs is not None:  # a captured shape's run, or None: it runs as usual
            logits = self.graphs.run(list(slots), list(ids), list(keep), top)
            if logits is not None:
                for slot, x in zip(slots, ids, strict=True):
                    self.kv.rows[slot].advance(x)
                return logits
        io = self._bind_rows(lo, hi)
        starts = [0, *itertools.accumulate(keep)][:-1]
        if g.masks == "graph":  # the graph builds positions and the causal mask from these: O(B) integers
            b = hi - lo
            parts = (
                (g.input_ids, (b, width)),
                (g.write_index, (b,)),
                (g.new_tokens, (b,)),
                (g.logits_rows, (len(rows_out),)),
            )
            values = flat + past + real + rows_out
            if g.attend_length:  # T itself: the longest row's end, rounded up to the bucket
                total = max(p + n for p, n in zip(past, real, strict=True))
                parts, values = (*parts, (g.attend_length, (1,))), values + [self.attend(total)]
            elif g.attend_bucket:
                parts, values = (*parts, (g.attend_bucket, (1,))), values + [self.bucket_size]
            logits = self._execute(io, {}, len(rows_out), starts, list(keep), top, (parts, values))
        else:  # a bundle from before: positions [B, S] and the mask [B, 1, S, T] made here
            input_ids = np.array(flat, np.int64).reshape(hi - lo, width)
            start = np.array(past, np.int64)
            positions = start[:, None] + np.arange(width)[None, :]
            total = max(p + n for p, n in zip(past, real, strict=True))  # T: the slots the longest row attends to
            mask = np.arange(total)[None, None, None, :] <= positions[:, None, :, None]  # causal, per row
            inputs = {g.input_ids: input_ids, g.position_ids: positions, g.write_index: start, g.attention_mask: mask}
            inputs[g.logits_rows] = np.array(rows_out, np.int64)
            logits = self._execute(io, inputs, len(rows_out), starts, list(keep), top)
        for slot, x in zip(slots, ids, strict=True):
            self.kv.rows[slot].advance(x)
        return logits
