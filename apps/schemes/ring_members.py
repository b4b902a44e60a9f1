"""Allreduce's machine, the part about its members: newcomers copy the weights from a
live member before their first round, the driver fetches them from one member for
checkpoints and at the end (the trainers hold the model, the driver does not), a member's
report of a collective, and what a checkpoint keeps of the members (velocity, hop
feedback, streamed trainers' states). ``allreduce.py``'s machine is a :class:`RingMembers`."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ddlf_actors.errors import ActorDiedError, DDLFError

from ..arrays import nbytes
from .errors import TooFewTrainersError
from .events import CallDone
from .machine import Machine
from .orders import Lose, Order
from .ring_parts import Collective, Fetch, hop_arrays, hop_meta, hop_state
from .rounds import Rounds
from .slots import Slot

__all__ = ["RingMembers", "WeightsLostError", "CollectiveError"]


class WeightsLostError(TooFewTrainersError):
    """Every trainer that held the model's current weights was lost at once."""


class CollectiveError(DDLFError):
    """The trainers could not complete an allreduce, or disagree on its result."""


class RingMembers(Machine):
    """Adoption, fetching, reports and checkpoints for a machine whose trainers hold the
    weights (see the module doc)."""

    fresh: set[int]
    digest: int | None
    run_id: int
    streamed: bool
    F: int
    adopting: dict[int, tuple[Slot, Slot]]
    after_adopt: Callable[[], list] | None
    waiting: Callable[[], list] | None
    fetch: Fetch | None
    coll: Collective | None
    rounds: Rounds
    hops: dict[int, dict]
    states: dict[int, tuple]
    pending_hops: dict[int, dict]
    pending_states: dict[int, tuple]

    #: The trainer's methods of a round (train and hold, then the collective), and the one
    #: a newcomer copies the run's state from a member with. Data-parallel names its own.
    hold_method = "hold_delta"
    reduce_method = "allreduce_held"
    adopt_method = "adopt_weights"

    def _reduce_extra(self, c: Collective) -> dict:
        """More keyword arguments of the collective's calls (a subclass's)."""
        return {}

    def _collective(self) -> Collective:
        """The collective in progress; ``RuntimeError`` when none is (a DDLF bug)."""
        if self.coll is None:
            raise RuntimeError("allreduce: no collective is in progress (a bug in DDLF, "
                               "please report it)")
        return self.coll

    def _fetching(self) -> Fetch:
        """The fetch of the weights in progress; ``RuntimeError`` when none is."""
        if self.fetch is None:
            raise RuntimeError("allreduce: no fetch of the weights is in progress (a bug in "
                               "DDLF, please report it)")
        return self.fetch

    # -- membership: every member holds the current weights ---------------------------------------
    def admit(self, slots) -> list[Order]:
        orders = super().admit(slots)
        self.fresh.update(s.index for s in slots)
        return orders

    def _members_ready(self, then: Callable[[], list]) -> list[Order] | None:
        """None when enough live trainers all hold the weights; else the orders that get
        there (newcomers copy them, or wait for trainers), then ``then()`` runs.
        :class:`WeightsLostError` at once when no live trainer holds them."""
        if not any(j not in self.fresh for j in self.live):
            raise WeightsLostError(self._weights_lost_message())
        need = self.too_few()
        if need:
            self.waiting = then
            return need
        fresh = [s for s in self.members() if s.index in self.fresh]
        if not fresh:
            return None
        holders = [s for s in self.members() if s.index not in self.fresh]
        orders: list[Order] = []
        for i, slot in enumerate(fresh):
            source = holders[i % len(holders)]
            spec: tuple = (("stream_adopt", (source.handle, self.run_id, self.F), {})
                           if self.streamed else (self.adopt_method, (source.handle,), {}))
            call = self.call(slot, spec)
            self.adopting[call.id] = (slot, source)
            orders.append(call)
        self.after_adopt = then
        return orders

    def _adopted(self, event: CallDone) -> list[Order]:
        slot, source = self.adopting.pop(event.call)
        value = event.value
        orders: list[Order] = []
        if value["status"] == "source_lost":
            # The runtime told the newcomer its source died: that is a loss.
            orders.append(Lose(source, ActorDiedError(value.get("detail") or "the actor died")))
        else:
            if self.digest is not None and value["digest"] != self.digest:
                raise CollectiveError(
                    f"trainer {slot.index} copied weights from trainer {source.index} "
                    f"whose CRC {value['digest']:#x} is not the run's {self.digest:#x}: "
                    "a bug in DDLF's allreduce, please report it")
            self.fresh.discard(slot.index)
        return orders + self._adoption_over()

    def _adoption_over(self) -> list[Order]:
        if self.adopting or self.after_adopt is None:
            return []
        then, self.after_adopt = self.after_adopt, None
        return then()

    def _weights_lost_message(self) -> str:
        return (f"training stopped at round {self.round_no}: every trainer holding the current "
                "weights was lost at once, and allreduce keeps the model only on its trainers "
                "(the driver fetches it for checkpoints and at the end).")

    # -- fetching the weights ------------------------------------------------------------------
    def _fetch_weights(self, slots: list[Slot] | None, velocity: bool,
                       then: Callable[[list, Any], list]) -> list[Order]:
        """The current weights (and with ``velocity`` the outer velocity, or []) from one
        trainer that holds them; ``then(weights, velocity)`` gives the orders after."""
        self.fetch = Fetch(slots, velocity, then)
        return self._fetch_from()

    def _fetch_from(self) -> list[Order]:
        f = self._fetching()
        candidates = f.slots if f.slots is not None else self.members()
        holders = [s for s in candidates if s.index not in self.fresh and s.index in self.live]
        if not holders:
            raise WeightsLostError(self._weights_lost_message())
        method = "stream_global" if self.streamed else "held_weights"
        call = self.call(holders[0], (method, (f.velocity,), {}))
        f.call = call.id
        return [call]

    def _fetched(self, event: CallDone) -> list[Order]:
        f, self.fetch = self._fetching(), None
        w, v = event.value
        w = [np.array(a, copy=True) for a in w]
        if self.streamed:
            v = [[np.array(a, copy=True) for a in part] for part in v]
            self.bytes_received += nbytes(w) + nbytes([a for part in v for a in part])
        else:
            v = [np.array(a, copy=True) for a in v]
            self.bytes_received += nbytes(w) + nbytes(v)
        return f.then(w, v)

    # -- a member's report of a collective ------------------------------------------------------
    def _member_out(self, slot: Slot, why: str) -> list[Order]:
        """A member failed its part: nobody waits for a chunk that will never come."""
        c = self._collective()
        if c.aborted:
            return []
        c.aborted = True
        return [self.call(other, ("abort_collective", (c.tag, why), {}), wait=False)
                for other in c.ring if other.index != slot.index and other.index in self.live]

    def _reply(self, slot: Slot, value: dict) -> list[Order]:
        """A member's report of the collective (its reply, or its next hold's)."""
        c = self._collective()
        c.replies[slot.index] = value
        c.record["status"][slot.index] = value["status"]
        c.replies_all.append(value)
        if value["status"] != "done":
            return self._member_out(slot, f"trainer {slot.index}: {value['status']} "
                                          f"({value.get('detail', '')})")
        return []

    # -- checkpoints -----------------------------------------------------------------------------
    def _arrays(self, velocity) -> dict:
        """A checkpoint's arrays: velocity, hop feedback, streamed trainers' states."""
        if self.streamed:
            arrays = {f"outer{f}": v for f, v in enumerate(velocity) if v}
        else:
            arrays = {"outer": velocity} if velocity else {}
        for j, state in self.hops.items():
            arrays[f"hop{j}"] = hop_arrays(state)
        for j, (_meta, saved) in self.states.items():
            arrays[f"stream{j}"] = saved
        return arrays

    def position(self) -> dict:
        return {**self.rounds.position(),
                "hops": {str(j): hop_meta(state) for j, state in self.hops.items()},
                "streams": {str(j): meta for j, (meta, _a) in self.states.items()}}

    def restore(self, ckpt) -> None:
        pos = ckpt.meta["position"]
        self.rounds.restore(pos, ckpt.arrays, self.round_no)
        for j, meta in pos.get("hops", {}).items():
            self.pending_hops[int(j)] = hop_state(meta, ckpt.arrays.get(f"hop{j}", []))
        for j, meta in pos.get("streams", {}).items():
            self.pending_states[int(j)] = (meta, ckpt.arrays.get(f"stream{j}", []))
