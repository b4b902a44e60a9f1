"""Faults for the in-process FakeBackend (``apps/backends/fake.py``)."""

from __future__ import annotations

__all__ = ["dies"]


def dies(slot: int, method: str, call: int):
    """A ``fail_when``: slot ``slot``'s trainer dies right before its ``call``-th
    ``method`` call, once (its replacement lives)."""
    fired = []

    def fail_when(actor, name, n):
        if fired or actor.instance is None or actor.instance._ddlf_index != slot:
            return False
        if name == method and n == call:
            fired.append(actor)
            return True
        return False
    return fail_when
