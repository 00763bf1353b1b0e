"""The engine: `load` (specrt/engine/load.py) a target (and optionally a draft) bundle, then `generate`.

    engine = specrt.load(target="engines/qwen-1.5b", draft="engines/qwen-0.5b", max_batch=4)
    gen = engine.generate("def fib(n):", specrt.GenerationOptions(max_new_tokens=64))
    for text in gen:
        print(text, end="", flush=True)
    print(gen.stats.summary())

`generate` may be called from any number of threads at once: every call returns its own streaming
Generation, and one scheduler thread runs the active ones as a batch of up to `max_batch` rows (more wait
in arrival order). The thread runs while there is work and stops when there is none, and at interpreter exit
after the run in flight (an ONNX Runtime run still going while the interpreter frees its objects aborts the
process).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections import Counter
from collections.abc import Sequence

from ..bundle.loading import check_pair, open_bundle
from ..decoding.drafters import NgramDrafter
from ..errors import EngineBusyError, OptionsError
from ..options import GenerationOptions
from ..runtime.buffers import Transfers
from ..runtime.sampler import GraphSampler, has_samplers
from ..runtime.session import ModelSession, SessionOptions
from ..tuning.batchcost import BatchCost
from ..tuning.costmodel import MODEL, NGRAM, Tuning
from ..tuning.machineload import Watch
from ..tuning.measure import (
    Interrupted,
    batch_estimate,
    busy,
    measure,
    measure_batches,
    profile_for,
    save_batch_profile,
    save_profile,
    session_batches,
    settings_key,
    stored_batch_profile,
)
from ..tuning.stepcost import CATCH_UP_WIDTH, DRAFT, TARGET, StepCosts
from .decide import PATHS, GraphDecider, HostDecider
from .generate import Generation
from .prompting import Prompts
from .request import Request
from .runner import Runner
from .scheduler import Scheduler

PathLike = str | os.PathLike
IDLE_S = 1.0  # idle seconds before the engine measures its batch (a gap between a client's requests is shorter)
REMEASURES = 2  # times a model's one-row profile is measured again when live timings prove it wrong
BATCH_TRIES = 3  # idle-moment batch measurements given up (work arrived, or other processes' load) before none
_ENGINES: weakref.WeakSet = weakref.WeakSet()  # every engine alive, for the stop at interpreter exit


@atexit.register
def _stop_engines() -> None:
    """Interpreter exit runs this after the program's own threads have ended and before modules are torn down:
    each engine's scheduler thread (a daemon, so that an abandoned generation never keeps a process alive)
    stops after its round or measurement in flight, and exit waits for it. Open generations end there."""
    for engine in list(_ENGINES):
        engine._stop()


class Engine:
    def __init__(
        self,
        target: PathLike,
        draft: PathLike | None = None,
        session_options: SessionOptions | None = None,
        draft_session_options: SessionOptions | None = None,
        ngram: bool = False,
        verify: bool = False,
        max_batch: int = 1,
        prefill_chunk: int = 128,
        sampler: str = "auto",
        draft_apart: bool = False,
    ):
        if sampler not in ("auto", *PATHS):
            raise OptionsError(f"sampler must be 'auto', 'graph' or 'host'; got {sampler!r}")
        if not (isinstance(max_batch, int) and not isinstance(max_batch, bool) and 1 <= max_batch <= 256):
            raise OptionsError(f"max_batch must be an integer in 1..256; got {max_batch!r}")
        if not (isinstance(prefill_chunk, int) and not isinstance(prefill_chunk, bool) and prefill_chunk >= 1):
            raise OptionsError(f"prefill_chunk must be an integer >= 1; got {prefill_chunk!r}")
        target_bundle = open_bundle(target, verify=verify)
        draft_bundle = open_bundle(draft, verify=verify) if draft is not None else None
        if draft_bundle is not None:
            check_pair(target_bundle, draft_bundle)  # before any weights are loaded
        self.tokenizer = target_bundle.load_tokenizer()
        session_options = session_options or SessionOptions()
        self.max_batch = max_batch
        self.transfers = Transfers()  # bytes between host and device, both models and the sampler graphs
        self.target = ModelSession(target_bundle, session_options, rows=max_batch, transfers=self.transfers)
        self.prompts = Prompts(self.tokenizer, self.target.vocab_size, self.target.max_len, target_bundle.path)
        draft_options = draft_session_options or session_options
        self.draft = (
            ModelSession(draft_bundle, draft_options, rows=max_batch, transfers=self.transfers)
            if draft_bundle
            else None
        )
        self.ngram = NgramDrafter() if ngram else None
        # Apart: the draft on a device of its own (or asked to run as if: the same exchange on one CPU).
        apart = draft_apart or (draft_options.device, draft_options.device_id) != (
            session_options.device,
            session_options.device_id,
        )
        self.decider = self._decider(
            sampler, target_bundle, session_options, draft_options if draft_bundle else None, apart
        )
        runner = Runner(self.target, self.draft, self.decider)
        self.scheduler = Scheduler(runner, max_batch, prefill_chunk, self._prepare)
        # Learned across generations, deliberately (see Tuning): the step costs are built at the first auto-k
        # generation; a later, larger max_draft_tokens reads widths past the profile by extrapolation.
        self.tuning = Tuning()
        self._remeasured: Counter[str] = Counter()  # profiles measured again, per model (StepCosts.wrong)
        self._batch_owed: list[ModelSession] = []  # sessions whose batch runs on an estimate (_batch_cost)
        self._batch_tries = 0  # idle-moment batch measurements given up (work arrived, or others' load)
        self._interrupt = threading.Event()  # reset(): give up the idle moment's measurement
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False  # set at interpreter exit: no more rounds
        _ENGINES.add(self)

    def _decider(self, sampler: str, bundle, options: SessionOptions, draft_options: SessionOptions | None, apart):
        """The sampler graphs on the target's device, and on the draft's where it runs apart (a device of its
        own, or asked for: `load(draft_device=...)`), else numpy on the host: for bundles exported before the
        graphs existed, or when asked."""
        if sampler == "host" or (sampler == "auto" and not has_samplers(bundle)):
            return HostDecider()
        target = GraphSampler(bundle, options, self.max_batch, self.transfers)
        if draft_options is None or not apart:
            return GraphDecider(target)
        return GraphDecider(target, GraphSampler(bundle, draft_options, self.max_batch, self.transfers))

    # ------------------------------------------------------------------ the scheduler thread

    def _submit(self, request: Request) -> None:
        with self._lock:
            if self._stopping:
                request.fail(EngineBusyError("the engine has stopped: the interpreter is exiting"))
                return
            self._inbox.put(request)
            self._wake.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="specrt-scheduler", daemon=True)
                self._thread.start()

    def _stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
            self._wake.set()  # an idle moment waiting to measure ends now
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        """Rounds while there is work; then the idle moment's upkeep, if any; the thread ends when there is
        neither (the next submit starts another), so an idle engine holds no thread and can be collected."""
        scheduler = self.scheduler
        while True:
            with self._lock:
                if self._stopping:
                    self._thread = None
                    return
                self._wake.clear()
                while not self._inbox.empty():
                    scheduler.submit(self._inbox.get())
                idle = not scheduler.has_work()
                if idle and not self._wrong_profiles() and not self._batch_pending():
                    self._thread = None
                    return
            if idle:  # outside the lock: requests submitted meanwhile wait in the inbox
                try:
                    if wrong := self._wrong_profiles():
                        self._remeasure(wrong)
                    self._measure_batch()
                except Exception:  # noqa: BLE001 - upkeep is optional: serve on what the engine has
                    self._remeasured.update({TARGET: REMEASURES, DRAFT: REMEASURES})
                    self._batch_owed = []
                continue
            try:
                scheduler.step()
            except BaseException as e:  # a bug in a round: fail its requests, keep serving the others
                for r in [*scheduler.running, *scheduler.waiting]:
                    r.fail(e)
                scheduler.slots = [None] * len(scheduler.slots)
                scheduler.waiting.clear()

    @property
    def stats(self) -> dict:
        """The engine's counters: rounds, batch sizes, k chosen, acceptance per position, queue wait, and
        how many requests hold a slot (running) or wait for one."""
        waiting = len(self.scheduler.waiting) + self._inbox.qsize()
        return {
            **self.scheduler.stats.to_dict(),
            "running": len(self.scheduler.running),
            "waiting": waiting,
            "sampler": self.decider.name,
            "bytes_to_host": self.transfers.to_host,
            "bytes_to_device": self.transfers.to_device,
            "bytes_across_devices": self.transfers.across,
        }

    def cancel_all(self) -> None:
        """Cancel every running and waiting generation (their readers end with finish_reason "cancelled")."""
        for r in [*self.scheduler.running, *self.scheduler.waiting]:
            r.cancel.set()

    # ------------------------------------------------------------------ cost models

    def _prepare(self, request: Request) -> None:
        """At admission, in the scheduler thread: the batch's costs, and the request's own cost models (auto
        k). One-row profiles missing for this machine are measured here, in the request's slot before its
        prefill (about a second); the batch's, which take minutes, in an idle moment (_measure_batch)."""
        drafts = self.draft is not None or self.ngram is not None
        rows = None  # the one-row profiles, once read (or measured: twice would measure twice if not stored)
        if self.max_batch > 1 and self.scheduler.batch_cost is None and drafts:
            self.scheduler.batch_cost, rows = self._batch_cost(request)
        if request.options.num_draft_tokens is not None or not request.drafters:
            return
        if self.tuning.steps is None:
            self.tuning.steps = StepCosts(*(rows or self._step_profiles(request)))
        request.costs = self.tuning.for_request([NGRAM if d is self.ngram else MODEL for d in request.drafters])

    def _step_profiles(self, request: Request) -> tuple:
        """The target's and the draft's one-row profiles, measured now in the request's slot if missing (the
        draft's up to CATCH_UP_WIDTH: its catch-ups are priced at its widest width, and its batched steps from
        them until the batch is measured; a draft measured at width 1 alone priced a catch-up at a full step
        per token)."""
        options, context, slot = request.options, len(request.prompt), request.slot
        target = profile_for(self.target, options.max_draft_tokens + 1, context, slot)
        draft = profile_for(self.draft, CATCH_UP_WIDTH, context, slot) if self.draft is not None else None
        return target, draft

    def _wrong_profiles(self) -> list[str]:
        steps = self.tuning.steps
        return [m for m in steps.wrong() if self._remeasured[m] < REMEASURES] if steps is not None else []

    def _remeasure(self, models: list[str]) -> None:
        """Measure again the profiles that live timings proved wrong (StepCosts.wrong), in the idle moment
        after the requests that proved it: the old profile's widths (the target's up to 9, auto k's default
        range), at one context,
        in the slot holding the shortest cached prefix (about a second for a 1.5B int4 target on 2 cores; a
        request arriving meanwhile waits). Measured on a quiet machine, the new profile replaces the old in
        memory and in the bundle, and the step costs start learning afresh from it; measured while other
        processes held the CPUs, it is dropped (the live corrections go on). At most REMEASURES per model."""
        steps, sessions = self.tuning.steps, {TARGET: self.target, DRAFT: self.draft}
        profiles = dict(steps.profiles)
        for model in models:
            if self._stopping:
                break
            self._remeasured[model] += 1
            session, old = sessions[model], steps.profiles[model]
            slot = min(range(self.max_batch), key=lambda i: session.kv.rows[i].length)
            # The draft's every width: catch-ups are priced at its widest (a width-1 profile stored here priced
            # them at a full step per token, 4.6x dear for 20 tokens: results/trust/remeasure-widths).
            widest = 9 if model == TARGET else CATCH_UP_WIDTH
            widths = [w for w in getattr(old, "widths", range(1, 10)) if w <= widest]
            contexts = getattr(old, "contexts", [64])[:1]
            try:
                fresh = measure(session, widths=widths, contexts=contexts, reps=2, slot=slot, tries=1)
            except Exception:  # noqa: BLE001 - keep serving on the old profile and the live corrections
                continue
            if self.draft is not None:  # the other model's slot no longer matches this one's
                sessions[DRAFT if model == TARGET else TARGET].kv.rows[slot].reset()
            if busy(fresh.others_share):  # no better than the old one: keep it and the live corrections
                continue
            fresh.settings = settings_key(session.options)
            save_profile(session.bundle.path, fresh)
            profiles[model] = fresh
        if profiles != steps.profiles:
            self.tuning.steps = StepCosts(profiles[TARGET], profiles[DRAFT])

    def _batch_cost(self, request: Request) -> tuple[BatchCost, tuple | None]:
        """The batch's t(B, S), built at the first admission, fixed k or auto (rows of auto k may join at any
        time, and a batch must not draft as if each row were alone): the stored profiles, else a stand-in
        priced from the one-row profiles (measure.batch_estimate) until the engine's first idle moment measures
        the batch (`_measure_batch`). Measuring at admission, over every slot, kept a server's first requests
        waiting: 115-124 s for the int4 1.5B + 0.5B pair on 2 cores. Also returns the one-row profiles it read
        (None: it needed none)."""
        sessions = [s for s in (self.target, self.draft) if s is not None]
        profiles = [stored_batch_profile(s) for s in sessions]
        self._batch_owed = [s for s, p in zip(sessions, profiles, strict=True) if p is None]
        rows = self._step_profiles(request) if self._batch_owed else None
        if rows is not None:
            profiles = [p or batch_estimate(s, row) for s, p, row in zip(sessions, profiles, rows, strict=False)]
        draft = profiles[1] if self.draft is not None else None
        return BatchCost(profiles[0], draft, policy=self.tuning.policy), rows

    def _batch_pending(self) -> bool:
        return bool(self._batch_owed) and self._batch_tries < BATCH_TRIES and not self._interrupt.is_set()

    def _measure_batch(self) -> None:
        """In an idle moment that lasted IDLE_S: measure the batch profiles the batch runs without (over every
        slot: the cached prompts are dropped), store them, and price the batch from them. A request arriving,
        or other processes taking the CPUs (machineload.Watch: its timings would be wrong, and its load would
        disturb them: another engine's benchmark or service) gives the measurement up within one timed run.
        BATCH_TRIES attempts in all (each drops the prompts cached for follow-ups): after them the stand-in
        and the rounds' corrections go on. Profiles another engine stored meanwhile are read, not measured."""
        if not self._batch_pending():
            return
        others = Watch()
        if self._wake.wait(IDLE_S) or self._yield():
            return  # work arrived (or a reset, or the exit) before the machine was ours
        # Another engine of this machine (a replica, a second server) may have measured and stored them.
        fresh = {id(s): p for s in self._batch_owed if (p := stored_batch_profile(s)) is not None}
        todo = [s for s in self._batch_owed if id(s) not in fresh]
        if todo:
            measured = self._measured(todo, others)
            if measured is None:
                self._batch_tries += 1
                return
            fresh.update(measured)
        old = self.scheduler.batch_cost
        target, draft = (fresh.get(id(s), p) for s, p in ((self.target, old.target), (self.draft, old.draft)))
        self.scheduler.batch_cost = BatchCost(target, draft, policy=old.policy, warm=old.warm)
        self._batch_owed = []

    def _measured(self, sessions: list[ModelSession], others: Watch) -> dict | None:
        """The batch profiles of `sessions`, measured now and stored (None: given up, or measured under load)."""
        if others.busy():  # other processes used the machine through the idle second
            return None
        stop = lambda: self._yield() or others.busy()  # noqa: E731 - work, or others' load, arrived
        fresh = {}
        try:
            for session in sessions:
                found = measure_batches(session, session_batches(session), stop=stop)
                if busy(found.others_share):
                    return None
                fresh[id(session)] = found
        except Interrupted:
            return None
        finally:
            for session in (self.target, self.draft):
                for row in session.kv.rows if session is not None else []:
                    row.reset()  # measured over, or no longer matching the other model's emptied slots
        for session in sessions:
            save_batch_profile(session, fresh[id(session)])
        return fresh

    def _yield(self) -> bool:
        """Whether the idle moment's measuring must stop: work arrived, or the engine resets or stops."""
        return self._stopping or self._interrupt.is_set() or not self._inbox.empty()

    def reset(self) -> None:
        """Forget the cached contexts (the next prompts are prefilled from scratch)."""
        with self._lock:
            busy = self.scheduler.has_work() or not self._inbox.empty()
            thread = self._thread
        if busy:
            raise EngineBusyError("generations are running; reset() the engine once they have finished")
        if thread is not None:
            self._interrupt.set()  # an idle moment's batch measurement gives up
            self._wake.set()
            thread.join()  # an idle scheduler thread is on its way out
            self._interrupt.clear()
        with self._lock:
            for session in (self.target, self.draft):
                for row in session.kv.rows if session is not None else []:
                    row.reset()

    @property
    def max_seq_len(self) -> int:
        return self.target.max_len

    def encode(self, prompt: str, chat: bool = False, system: str | None = None) -> list[int]:
        return self.prompts.encode(prompt, chat, system)

    def encode_messages(self, messages: Sequence[dict]) -> list[int]:
        """A conversation ({"role", "content"} dicts) through the bundle's chat template."""
        return self.prompts.encode_messages(messages)

    def token_ids(self, prompt: Sequence[int]) -> list[int]:
        """A prompt given as token ids: integers (Python or numpy) inside the target's vocabulary."""
        return self.prompts.token_ids(prompt)

    def generate(
        self,
        prompt: str | Sequence[int],
        options: GenerationOptions | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
    ) -> Generation:
        """Start a streaming generation; iterate it for text. With options.num_draft_tokens == 0, or no
        draft loaded, this is plain target-only decoding through the same loop."""
        options = GenerationOptions() if options is None else options
        if not isinstance(options, GenerationOptions):
            raise OptionsError(f"options must be a specrt.GenerationOptions, got {type(options).__name__}")
        ids = self.prompts.ids(prompt, chat, system)
        request = Request(ids, options, set(self.tokenizer.eos_token_ids), self.max_seq_len)
        if options.num_draft_tokens != 0:
            request.drafters = [d for d in (self.ngram, self.draft) if d is not None]
        return Generation(request, self.tokenizer, self._submit)

    def complete(self, prompt: str | Sequence[int], options: GenerationOptions | None = None, **kw) -> Generation:
        """Run a generation to the end and return it (text, token_ids, stats, finish_reason)."""
        return self.generate(prompt, options, **kw).consume()
