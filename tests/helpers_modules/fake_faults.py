"""Faults for the in-process FakeBackend (``apps/backends/fake.py``)."""

from __future__ import annotations

__all__ = ["dies", "dies_starting", "hangs_starting"]


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


def dies_starting(slot: int, times: int, hold=None):
    """A ``fail_when``: slot ``slot``'s first ``times`` trainers die while starting (their
    process killed in ``__init__``: nothing raised). With ``hold`` (a
    ``threading.Event``), the next one waits for it before it starts, so a test decides
    when it can join. ``fail_when.tries`` counts the trainers the slot had."""
    def fail_when(actor, name, n):
        if name != "__init__" or len(actor.args) < 3 or actor.args[2] != slot:
            return False
        fail_when.tries += 1
        if fail_when.tries <= times:
            return True
        if hold is not None:
            hold.wait(30)
        return False
    fail_when.tries = 0
    return fail_when


def hangs_starting(slot: int, times: int, release):
    """A ``fail_when``: slot ``slot``'s first ``times`` trainers hang while starting,
    neither ready nor dead, until ``release`` (a ``threading.Event``) is set; a killed one
    then stays dead. ``fail_when.tries`` counts the trainers the slot had."""
    def fail_when(actor, name, n):
        if name != "__init__" or len(actor.args) < 3 or actor.args[2] != slot:
            return False
        fail_when.tries += 1
        if fail_when.tries <= times:
            release.wait(60)
        return False
    fail_when.tries = 0
    return fail_when
