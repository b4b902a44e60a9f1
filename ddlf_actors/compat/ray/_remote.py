"""``ray.remote`` and ``.options()``: translate Ray's options into DDLF's.

An option DDLF has passes through (``num_gpus``, ``memory`` and ``runtime_env`` among
them: DDLF checks a runtime env's fields and paths itself). One that only tunes Ray's
scheduling or bookkeeping is dropped with a warning. One that changes what a program
computes (concurrency groups) raises ``NotImplementedError`` naming it, rather than
running the program differently. ``scheduling_strategy`` and Ray's older
``placement_group=`` options map onto DDLF's scheduling strategies.
"""

from __future__ import annotations

import inspect
import warnings

from ddlf_actors.actor import ActorClass
from ddlf_actors.options import ACTOR_OPTIONS, TASK_OPTIONS
from ddlf_actors.remote_function import RemoteFunction
from ddlf_actors.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

__all__ = ["remote", "translate_options", "RayActorClass", "RayRemoteFunction",
           "NodeAffinitySchedulingStrategy"]

# Ray's default for an actor with async methods: calls interleave on its event loop.
_ASYNC_ACTOR_CONCURRENCY = 1000

# Ray options DDLF ignores: they tune placement or bookkeeping, not results.
_IGNORED = {
    "object_store_memory": "DDLF has no shared object store",
    "max_task_retries": "max_task_retries applies to actors only",
    # Tasks take it (a DDLF option); on actors it falls through to here.
    "retry_exceptions": "DDLF retries an actor call only when the actor's process dies "
                        "(max_task_retries), not when the method raises",
    "max_pending_calls": "DDLF does not limit pending actor calls",
    "allow_out_of_order_execution": "DDLF runs one caller's calls in order",
    "namespace": "DDLF has one namespace per cluster",
    "accelerator_type": "DDLF does not schedule by accelerator type",
    "label_selector": "DDLF has no node labels",
    "_labels": "DDLF has no node labels",
    "enable_task_events": None,   # no task events to turn off: nothing to warn about
    "_metadata": None,
}

# Ray's options from before scheduling_strategy (still accepted by Ray).
_LEGACY_PLACEMENT = ("placement_group", "placement_group_bundle_index",
                     "placement_group_capture_child_tasks")

# Ray options that would change a program's meaning: refuse them by name.
_UNSUPPORTED = {
    "concurrency_groups": "concurrency groups",
    "tensor_transport": "GPU tensor transport",
}

_warned: set = set()


def _warn_ignored(key: str, why: str | None) -> None:
    if why and key not in _warned:
        _warned.add(key)
        warnings.warn(f"ddlf_actors.compat.ray ignores the Ray option {key!r}: {why}",
                      stacklevel=4)


def translate_options(options: dict, for_actor: bool) -> dict:
    """Ray's ``@ray.remote``/``.options()`` keywords -> DDLF's, or ``NotImplementedError``."""
    allowed = ACTOR_OPTIONS if for_actor else TASK_OPTIONS
    what = "actor" if for_actor else "task"
    out: dict = {}
    legacy = {k: options.get(k) for k in _LEGACY_PLACEMENT}
    for key, value in options.items():
        if key == "resources":
            out["resources"] = {**(value or {}), **out.get("resources", {})}
        elif key == "num_returns" and "num_returns" not in allowed:
            if value not in (None, 1):
                raise NotImplementedError(
                    f"num_returns={value!r} on a {what}: DDLF does not support multiple "
                    "return values yet; return a tuple and unpack it after ray.get")
        elif key == "scheduling_strategy":
            if value is not None:
                out["scheduling_strategy"] = value   # DDLF checks it (ValueError if bad)
        elif key in _LEGACY_PLACEMENT:
            pass   # combined below
        elif key in _UNSUPPORTED:
            # Ray's own defaults for these options mean "not used": accept them.
            if value not in (None, {}, [], False, -1, "default"):
                raise NotImplementedError(f"the Ray option {key}=...: DDLF has no "
                                          f"{_UNSUPPORTED[key]}")
        elif key in allowed:
            if value is not None:
                out[key] = value
        elif key in _IGNORED:
            if value not in (None, 0, False, {}, ""):
                _warn_ignored(key, _IGNORED[key])
        else:
            raise ValueError(f"unknown Ray option {key!r} for a {what}; DDLF accepts "
                             f"{sorted(allowed | set(_IGNORED))}")
    pg = legacy["placement_group"]
    if pg not in (None, "default"):
        if "scheduling_strategy" in out:
            raise ValueError("give either scheduling_strategy=... or placement_group=..., "
                             "not both")
        index = legacy["placement_group_bundle_index"]
        out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            pg, -1 if index is None else index, legacy["placement_group_capture_child_tasks"])
    if not out.get("resources"):
        out.pop("resources", None)
    return out


def _is_async_class(cls: type) -> bool:
    return any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
               for _, f in inspect.getmembers(cls, inspect.isfunction))


class RayActorClass(ActorClass):
    """An ``ActorClass`` whose ``.options()`` takes Ray's keywords."""

    def __init__(self, cls: type, options: dict):
        options = translate_options(options, for_actor=True)
        if "max_concurrency" not in options and _is_async_class(cls):
            options["max_concurrency"] = _ASYNC_ACTOR_CONCURRENCY
        super().__init__(cls, options)

    def options(self, **options):
        return super().options(**translate_options(options, for_actor=True))


class RayRemoteFunction(RemoteFunction):
    """A ``RemoteFunction`` whose ``.options()`` takes Ray's keywords."""

    def __init__(self, fn, options: dict):
        super().__init__(fn, translate_options(options, for_actor=False))

    def options(self, **options):
        return super().options(**translate_options(options, for_actor=False))


def remote(*args, **options):
    """``@ray.remote`` / ``@ray.remote(num_cpus=..., ...)`` for classes and functions."""
    if len(args) == 1 and not options and callable(args[0]):
        return _make(args[0], {})
    if args:
        raise TypeError("use @ray.remote or @ray.remote(option=value, ...)")
    return lambda obj: _make(obj, options)


def _make(obj, options: dict):
    if inspect.isclass(obj):
        return RayActorClass(obj, options)
    if callable(obj):
        return RayRemoteFunction(obj, options)
    raise TypeError(f"@ray.remote applies to classes and functions, not {type(obj).__name__}")
