"""Prefix-affinity routing inside Ray Serve: a `RequestRouter` for the engine deployment that sends a prompt
to the replica holding its longest cached prefix (specrt/scale/affinity.py decides), unless that replica is
much busier than the least busy one.

Ray Serve makes one router per handle, in the calling process (the front end): each front end replica
keeps its own table and counts the requests it has in flight on each engine replica (routed, not yet
completed), which is the load it balances. A request counts from `on_request_routed` (the replica accepted
it) until its result is done, through a done-callback on that result: Ray's own `on_request_completed` comes
from a callback registered before the replica accepts, so a short request can complete before it is counted
as routed, and a count paired with that hook would keep it in flight forever (a replica believed busy gets
no new conversations: seen as every conversation on one replica).

The router returns ranks: the chosen replica first, then the others from least to most loaded, so a chosen
replica already at max_ongoing_requests hands the request to the next. An exception in `choose_replicas`
would leave the request waiting forever (Ray Serve only logs it): any failure here falls back to all
candidates, Ray's own choice.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .affinity import PrefixTable

log = logging.getLogger("specrt.scale")


def _prompt_ids(pending: PendingRequest | None) -> list[int] | None:
    """The prompt ids of an engine call (`EngineReplica.generate(job)`); None for any other call."""
    if pending is None or not pending.args:
        return None
    ids = getattr(pending.args[0], "prompt_ids", None)
    return ids if isinstance(ids, list) and ids else None


class AffinityRouter(RequestRouter):
    def initialize_state(self, block: int = 16, slack: int = 2, capacity: int = 200_000, slots: int = 4) -> None:
        self.table = PrefixTable(block, capacity, slack, slots)
        self.load: Counter[ReplicaID] = Counter()  # this router's requests in flight, per replica
        self.picks: Counter[str] = Counter()  # why each prompt went where it went

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        try:
            ids = _prompt_ids(pending_request)
            if ids is None or len(candidate_replicas) < 2:
                return [candidate_replicas]
            by_id = {r.replica_id: r for r in candidate_replicas}
            order = list(by_id)
            random.shuffle(order)  # equally loaded replicas take turns
            pick = self.table.choose(ids, {rid: self.load[rid] for rid in order})
            self.picks[pick.why] += 1
            rest = sorted((rid for rid in order if rid != pick.replica), key=self.load.__getitem__)
            return [[by_id[pick.replica]], [by_id[rid] for rid in rest]]
        except Exception:  # noqa: BLE001 - a raise here would hang the request
            log.exception("prefix-affinity routing failed; letting Ray Serve choose")
            return [candidate_replicas]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        ids = _prompt_ids(pending_request)
        if ids is None:
            return
        self.table.record_prompt(ids, replica_id)
        self.load[replica_id] += 1
        # The callback runs once, at once if the result is already done, possibly on another thread.
        loop = asyncio.get_running_loop()
        result.add_done_callback(lambda _: loop.call_soon_threadsafe(self._finished, replica_id))

    def _finished(self, replica_id: ReplicaID) -> None:
        if self.load[replica_id] > 0:  # not a replica forgotten since (on_replica_actor_died)
            self.load[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id)  # its cache died with it
        self.load.pop(replica_id, None)
