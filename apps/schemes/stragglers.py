"""Late deltas for ``train_sync(backup_workers=b)``: rounds that do not wait for the slowest.

A round closes once all but ``b`` of its train calls have returned (never with fewer
than one delta). The calls still running are *late*: their trainers get no new work and
no evaluation shard until their delta is in, and the delta is not thrown away but
folded into the round that is open when it arrives, weighted by its samples divided by
``1 + staleness``, where staleness is how many rounds were applied since the weights it
started from (1 when it lands in the next round):

    w ← w − Σ_j (m_j / Σm) delta_j,   m_j = n_j / (1 + s_j),   s_j = 0 for on-time deltas

With ``balance=True`` too, the trainers are sized to finish together, so the last
one is usually last by a little: a round whose quota is in waits a further
``BALANCED_GRACE`` (15 %) of its time so far for it before leaving it late (a late
trainer sits out the next round, which would cost more). At most ``b`` calls are late at any time (a round that starts with ``l`` late calls
may leave only ``b − l`` of its own behind), so every trainer's work is applied at most
a few rounds after it started, and every sample of an epoch is still trained once. The
last round of a run waits for every call, late or not.

Faults: a trainer lost while late loses its delta (its share of one round, as a trainer
lost mid-round does); its replacement joins at the next round. Checkpoints are written
after a round closes, without the late calls then in flight: a resumed run does not get
their deltas (at most ``b`` trainers' shares of one round), and the checkpoint's
position lists them. Which calls are late depends on the trainers' speeds, so a run
with ``backup_workers`` is not reproducible bit for bit, resumed or not.
"""

from __future__ import annotations

import dataclasses

from .slots import Slot

__all__ = ["LateDeltas", "LateCall", "within_window", "BALANCED_GRACE"]

# With balance=True, a round whose quota is in waits this fraction of its time so far
# for the calls it could leave late.
BALANCED_GRACE = 0.15


@dataclasses.dataclass
class LateCall:
    """A train call left running when its round closed."""

    slot: Slot
    round: int           # the round it was handed out in (1-based)
    samples: int


@dataclasses.dataclass
class _Arrival:
    call: LateCall
    delta: list
    stats: dict
    t: float             # when the driver received it (perf_counter)


def within_window(stats: dict, t_start: float, t_arrive: float) -> dict:
    """``stats`` of a call that returned at ``t_arrive``, with its compute and evaluation
    time cut to what falls after ``t_start`` (the row's start).

    The trainer's work is taken as ending when the driver got it: compute last, its
    evaluation shard before that. A late delta's row then never counts time spent before
    the row began, so ``compute_s`` stays within ``wall_s`` and ``overhead_s`` >= 0.
    """
    inside = max(0.0, t_arrive - t_start)
    compute = min(stats["compute_s"], inside)
    return {**stats, "compute_s": compute,
            "eval_s": min(stats.get("eval_s", 0.0), max(0.0, inside - stats["compute_s"]))}


class LateDeltas:
    """The late calls of a run and the late deltas waiting to be folded in."""

    def __init__(self, backup_workers: int, balanced: bool = False):
        self.backup_workers = int(backup_workers)
        # With balance=True every trainer is sized to finish together, so one that is
        # last is usually last by a little: a round waits a little for it rather than
        # leave it late (a late trainer sits out the next round).
        self.grace = BALANCED_GRACE if balanced else 0.0
        self.inflight: dict[int, LateCall] = {}     # call id -> the call
        self.arrived: list[_Arrival] = []

    # -- who works ---------------------------------------------------------------------------
    def busy(self) -> set[int]:
        """Slots whose trainer is still on a late call."""
        return {c.slot.index for c in self.inflight.values()}

    def idle(self, live: list[Slot]) -> list[Slot]:
        """The live trainers that may take work now."""
        busy = self.busy()
        return [s for s in live if s.index not in busy]

    def allowed(self, calls: int, final: bool) -> int:
        """How many of a round's ``calls`` may still run when it closes."""
        if final or not self.backup_workers:
            return 0
        return max(0, min(self.backup_workers - len(self.inflight), calls - 1))

    def grace_until(self, t_start: float, now: float) -> float:
        """When a round begun at ``t_start``, whose quota of deltas is in at ``now``,
        stops waiting for the calls it may leave late."""
        return now + self.grace * (now - t_start)

    # -- calls -------------------------------------------------------------------------------
    def owns(self, call_id: int) -> bool:
        return call_id in self.inflight

    def defer(self, call_id: int, slot: Slot, round_no: int, samples: int) -> None:
        """A call of round ``round_no`` is still running as the round closes."""
        self.inflight[call_id] = LateCall(slot, round_no, samples)

    def take(self, call_id: int) -> LateCall:
        return self.inflight.pop(call_id)

    def arrive(self, call: LateCall, value, now: float) -> None:
        """``call`` returned ``value`` at ``now`` (the driver's clock)."""
        delta, stats = value
        self.arrived.append(_Arrival(call, delta, stats, now))

    # -- folding -----------------------------------------------------------------------------
    def fold(self, round_no: int, t_start: float,
             fragments: int = 1) -> list[tuple[int, list, dict, dict, int]]:
        """The late deltas to apply when round ``round_no`` closes, by slot:
        ``[(slot, delta, stats, stats within the row's window, staleness)]``; clears them.
        With ``fragments=F`` (rounds that each sync one of F fragments in turn) only the
        deltas of this round's fragment fold in (the others wait for their own fragment's
        round); staleness is in rounds, F per step of a fragment."""
        out, kept = [], []
        for a in sorted(self.arrived, key=lambda a: (a.call.slot.index, a.call.round)):
            behind = round_no - a.call.round
            if behind % fragments:
                kept.append(a)
                continue
            out.append((a.call.slot.index, a.delta, a.stats,
                        within_window(a.stats, t_start, a.t), behind))
        self.arrived = kept
        return out

    @staticmethod
    def weight(samples: int, staleness: int) -> float:
        """A delta's weight in the round's mean: its samples, scaled down by staleness."""
        return samples / (1.0 + staleness)

    def to_json(self) -> list:
        """The late calls in flight, as a checkpoint records them (their deltas are not
        in the checkpoint: a resumed run goes on without them)."""
        return [{"trainer": c.slot.index, "round": c.round, "samples": c.samples}
                for c in self.inflight.values()]
