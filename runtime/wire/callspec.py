"""What a ``CALL`` frame carries: an actor method call (:class:`CallSpec`) or a task
(:class:`TaskSpec`), as the caller builds it and the worker decodes it, once.

Ray's ``TaskSpec`` and Pykka's ``ProxyCall`` play this part: one typed value per call,
read by field name on both sides. On the wire a spec is a plain tuple of its fields in
the order below, with trailing fields left off while they hold their defaults:

==========  =====================================================================
CallSpec    ``(method, args, kwargs[, num_returns[, backpressure]])``
TaskSpec    ``(fn_id, fn_name, job_id, args, kwargs[, num_returns[, backpressure[,
            placement]]])``
==========  =====================================================================

so a plain call pickles to exactly the bytes it did as a hand-built tuple, and stays
eligible for plain pickle (``serialization.dumps`` takes its fast path only for builtin
containers; a dataclass instance would send every call through cloudpickle, with its
class name on the wire). ``args`` and ``kwargs`` are the caller's, with top-level refs
replaced by ``ArgRef`` placeholders (``dependencies.split_refs``).

``from_wire`` checks what it reads and raises :class:`~messages.MessageError` naming the
field, which the worker sends back as the call's error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from .messages import MessageError

__all__ = ["CallSpec", "TaskSpec", "NumReturns", "STREAMING", "DYNAMIC"]

# The same strings as generators.STREAMING/DYNAMIC (imported from there would pull the
# caller's stream machinery into every worker for two constants).
STREAMING = "streaming"
DYNAMIC = "dynamic"
NumReturns = Union[int, str]   # an int >= 1, STREAMING or DYNAMIC


_SEQUENCES = (tuple, list)
_GENERATORS = (STREAMING, DYNAMIC)


def _num_returns_ok(n) -> bool:
    return n >= 1 if type(n) is int else n in _GENERATORS


def _bad_body(body, what: str, least: int, most: int) -> MessageError:
    n = len(body) if type(body) is tuple else type(body).__name__
    return MessageError(f"a {what} is a tuple of {least} to {most} fields, got {n}; the "
                        "caller runs another DDLF release (run the same one everywhere)")


def _malformed(spec, checks) -> MessageError:
    """The error naming the first field of ``spec`` that fails its check."""
    what = type(spec).__name__
    for field, ok, must in checks:
        value = getattr(spec, field)
        if not ok(value):
            got = f"{value!r:.40}" if field == "num_returns" else type(value).__name__
            return MessageError(f"{what}.{field} must be {must}, got {got}")
    return MessageError(f"{what} is malformed")


_COMMON_CHECKS = (
    ("args", lambda v: type(v) in _SEQUENCES, "a tuple"),
    ("kwargs", lambda v: type(v) is dict, "a dict"),
    ("num_returns", _num_returns_ok, f"an int >= 1, {STREAMING!r} or {DYNAMIC!r}"),
    ("backpressure", lambda v: type(v) is int, "an int"),
)


@dataclass(slots=True)
class CallSpec:
    """One actor method call: ``handle.method.options(num_returns=...).remote(*args)``."""

    method: str
    args: Any   # tuple (or list) of arguments
    kwargs: dict | None   # a dict; None once the worker has handed it to the call
    num_returns: NumReturns = 1
    # A streaming generator pauses once this many yielded values wait unconsumed by the
    # caller (Ray's _generator_backpressure_num_objects); -1: never.
    backpressure: int = -1

    @property
    def streaming(self) -> bool:
        """True for a generator call (``num_returns`` "streaming" or "dynamic")."""
        return type(self.num_returns) is str

    def to_wire(self) -> tuple:
        if self.backpressure == -1:
            if self.num_returns == 1:
                return (self.method, self.args, self.kwargs)
            return (self.method, self.args, self.kwargs, self.num_returns)
        return (self.method, self.args, self.kwargs, self.num_returns, self.backpressure)

    @classmethod
    def from_wire(cls, body) -> CallSpec:
        """The spec ``body`` (a received tuple) describes; ``MessageError`` if malformed."""
        if type(body) is not tuple or not 3 <= len(body) <= 5:
            raise _bad_body(body, "CallSpec", 3, 5)
        spec = cls(*body)
        if (type(spec.method) is str and type(spec.args) in _SEQUENCES
                and type(spec.kwargs) is dict and _num_returns_ok(spec.num_returns)
                and type(spec.backpressure) is int):
            return spec
        raise _malformed(spec, _CALL_CHECKS)


_CALL_CHECKS = (("method", lambda v: type(v) is str, "a str"), *_COMMON_CHECKS)


@dataclass(slots=True)
class TaskSpec:
    """One task: ``f.options(num_returns=...).remote(*args)`` of a function shipped to the
    worker once per connection (a ``FUNC`` frame, by ``fn_id``)."""

    fn_id: bytes
    fn_name: str
    job_id: Any   # str, or None for a task submitted outside a job
    args: Any
    kwargs: dict | None   # a dict; None once the worker has handed it to the call
    num_returns: NumReturns = 1
    backpressure: int = -1
    # The placement group it runs in: {"group_id", "bundles", "capture"}, or None.
    placement: Any = None

    @property
    def streaming(self) -> bool:
        return type(self.num_returns) is str

    def to_wire(self) -> tuple:
        head = (self.fn_id, self.fn_name, self.job_id, self.args, self.kwargs)
        if self.placement is not None:
            return (*head, self.num_returns, self.backpressure, self.placement)
        if self.backpressure != -1:
            return (*head, self.num_returns, self.backpressure)
        if self.num_returns != 1:
            return (*head, self.num_returns)
        return head

    @classmethod
    def from_wire(cls, body) -> TaskSpec:
        """The spec ``body`` (a received tuple) describes; ``MessageError`` if malformed."""
        if type(body) is not tuple or not 5 <= len(body) <= 8:
            raise _bad_body(body, "TaskSpec", 5, 8)
        spec = cls(*body)
        if (type(spec.fn_id) is bytes and type(spec.fn_name) is str
                and (spec.job_id is None or type(spec.job_id) is str)
                and type(spec.args) in _SEQUENCES and type(spec.kwargs) is dict
                and _num_returns_ok(spec.num_returns) and type(spec.backpressure) is int
                and (spec.placement is None or type(spec.placement) is dict)):
            return spec
        raise _malformed(spec, _TASK_CHECKS)


_TASK_CHECKS = (
    ("fn_id", lambda v: type(v) is bytes, "bytes"),
    ("fn_name", lambda v: type(v) is str, "a str"),
    ("job_id", lambda v: v is None or type(v) is str, "a str or None"),
    *_COMMON_CHECKS,
    ("placement", lambda v: v is None or type(v) is dict, "a dict or None"),
)
