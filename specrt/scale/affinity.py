"""Prefix affinity: which replica should get a prompt, given which replicas have recently seen its prefixes.

A replica's engine keeps each finished request's context in its KV slot and reuses the longest cached prefix
of a new prompt (a conversation's next turn, a shared system prompt): those tokens are not prefilled again.
That saving exists only on the replica that holds them, so a router that spreads requests by load alone
throws most of it away once there are several replicas. This module is the decision, with no Ray in it
(specrt/scale/router.py plugs it into Ray Serve's request router):

- a prompt's token ids are cut into blocks of `block` tokens, each block named by a hash of itself and
  every block before it (so a name stands for a whole prefix, as in a radix tree, with no tree to keep);
- `PrefixTable` remembers, for the last `capacity` block names, the replica a prompt holding that prefix was
  last sent to (least recently used names are forgotten first: the replicas' caches forget too);
- `choose` prefers the replica holding the longest known prefix, unless it is busier than the least busy
  candidate by more than `slack` requests (then cached tokens are worth less than waiting); otherwise, and
  for a prompt nobody has seen, the least busy candidate wins; among equally busy ones, the one holding the
  fewest contexts (each replica's last `slots` prompts, a prompt that extends an earlier one replacing it,
  as its engine's KV slots would), and among full ones the one whose oldest context is stalest, so that
  new conversations spread over the replicas' slots instead of piling into one replica's, evicting each
  other while the other's slots sit idle. Once the request is on a replica, `record_prompt` notes that
  replica as holding all the prompt's prefixes.

A replica that is not among the candidates (gone, restarting) is simply not chosen: its names age out.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def block_names(ids: Sequence[int], block: int) -> list[bytes]:
    """The names of the prompt's whole blocks of `block` tokens: name i stands for ids[: (i + 1) * block]."""
    arr = np.asarray(ids, dtype=np.int64)
    names, h = [], b""
    for end in range(block, len(arr) + 1, block):
        h = hashlib.blake2b(h + arr[end - block : end].tobytes(), digest_size=16).digest()
        names.append(h)
    return names


@dataclass(frozen=True)
class Pick:
    replica: Hashable
    matched_tokens: int  # tokens of the prompt the chosen replica is believed to hold
    why: str  # "prefix", "balance" (the holder was too busy) or "new" (no replica holds any prefix)


class PrefixTable:
    """Block name -> the replica last sent a prompt with that prefix, least recently used names forgotten."""

    def __init__(self, block: int = 16, capacity: int = 200_000, slack: int = 4, slots: int = 4):
        if block < 1 or capacity < 1 or slack < 0 or slots < 1:
            raise ValueError(
                f"block, capacity, slots >= 1 and slack >= 0 needed; got {block}, {capacity}, {slots}, {slack}"
            )
        self.block, self.capacity, self.slack, self.slots = block, capacity, slack, slots
        self._owner: OrderedDict[bytes, Hashable] = OrderedDict()
        self._contexts: dict[Hashable, OrderedDict[bytes, int]] = {}  # replica -> its prompts' last names
        self._recorded = 0  # prompts recorded so far: when each context was last used

    def holder(self, names: Sequence[bytes], candidates: Mapping[Hashable, int]) -> tuple[Hashable | None, int]:
        """The candidate holding the longest prefix among `names`, and how many blocks it holds."""
        for n in range(len(names), 0, -1):
            owner = self._owner.get(names[n - 1])
            if owner is not None and owner in candidates:
                return owner, n
        return None, 0

    def choose(self, ids: Sequence[int], load: Mapping[Hashable, int]) -> Pick:
        """The replica for a prompt, given each candidate's load (requests queued or running on it); ties
        between equally loaded replicas go to the first in `load`'s order (the caller shuffles it)."""
        if not load:
            raise ValueError("no candidate replicas")
        least = min(load, key=lambda r: (load[r], *self._room(r)))
        owner, blocks = self.holder(block_names(ids, self.block), load)
        if owner is None:
            return Pick(least, 0, "new")
        if load[owner] - load[least] > self.slack:
            return Pick(least, 0, "balance")
        return Pick(owner, blocks * self.block, "prefix")

    def _room(self, replica: Hashable) -> tuple[int, int]:
        """How a new context would fit on a replica: its contexts held, then when its oldest was last used
        (a full replica whose oldest context is stalest loses the least by taking a new one)."""
        contexts = self._contexts.get(replica)
        if not contexts:
            return (0, -1)
        return (len(contexts), next(iter(contexts.values())) if len(contexts) >= self.slots else -1)

    def record_prompt(self, ids: Sequence[int], replica: Hashable) -> None:
        """The request with these prompt ids runs on `replica`: it will hold all their prefixes."""
        self.record(block_names(ids, self.block), replica)

    def record(self, names: Sequence[bytes], replica: Hashable) -> None:
        for name in names:
            self._owner[name] = replica
            self._owner.move_to_end(name)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)
        contexts = self._contexts.setdefault(replica, OrderedDict())
        for name in names:  # an earlier prompt this one repeats or extends: its slot is reused
            contexts.pop(name, None)
        if names:
            self._recorded += 1
            contexts[names[-1]] = self._recorded
        while len(contexts) > self.slots:
            contexts.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        """A replica that died: its cache is gone with it."""
        for name in [n for n, r in self._owner.items() if r == replica]:
            del self._owner[name]
        self._contexts.pop(replica, None)

    def __len__(self) -> int:
        return len(self._owner)
