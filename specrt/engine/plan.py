"""One row's part of a round: the scheduler's plan for it (who drafts, how many tokens at most, what was
proposed, what the draft must catch up on first) and what the round measured (`Times`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tuning.costmodel import MODEL, Choice
from .runner import Proposal


@dataclass
class Plan:
    """One row's part of a round: who drafts, how many tokens at most, and what was proposed."""

    drafter: str | None  # MODEL, NGRAM or None (a plain step)
    k: int
    lookup: list[int] = field(default_factory=list)  # prompt lookup's proposal
    choices: dict[str, Choice] = field(default_factory=dict)  # each auto-k drafter's answer (for learning)
    proposal: Proposal = field(default_factory=Proposal)
    missed: int = 0  # output tokens the row's draft sat out (fed before its first draft step)
    spare: str | None = None  # a row that chose not to draft: the drafter a batch's probe would draft with
    room: int = 0  # the most tokens the row's drafter could draft this round (how wide a batch's probe may go)

    @property
    def widens(self) -> bool:
        """The model drafts its whole ceiling this round, to time a wider pass (`Choice.why` "widen")."""
        choice = self.choices.get(MODEL)
        return self.drafter == MODEL and choice is not None and choice.why == "widen"

    @property
    def drafts_with(self) -> str | None:
        """The drafter of the row's drafts, chosen or, for a batch's probe, spare."""
        return self.drafter or self.spare

    def capped(self, k: int) -> Plan:
        """The plan with k drafts (fewer than chosen: the batch's ceiling; more: the batch's probe)."""
        return Plan(self.drafts_with if k else None, k, self.lookup[:k], self.choices, missed=self.missed)


@dataclass
class Times:
    """A round's measured milliseconds: the batched draft steps and the target pass."""

    draft_ms: float
    target_ms: float
    alone: bool  # one row: the times are its own forwards
    decide_ms: float = 0.0  # the verification's own graph run (inside ONNX Runtime, beside the target pass)
    catch_up: tuple[int, float] = (0, 0.0)  # tokens the draft was fed before drafting (it missed them), ms
