"""Validation of the options accepted by ``@ddlf.remote`` and ``.options()``."""

from __future__ import annotations

from ddlf_actors.runtime import runtime_env as _runtime_env
from ddlf_actors.runtime.client.core import check_backpressure

__all__ = ["ACTOR_OPTIONS", "TASK_OPTIONS", "METHOD_OPTIONS", "BACKPRESSURE", "validate",
           "check_gpus", "check_memory"]

_COMMON = {"num_cpus", "num_gpus", "memory", "resources", "name", "runtime_env",
           "scheduling_strategy"}
ACTOR_OPTIONS = _COMMON | {"max_restarts", "max_concurrency", "lifetime", "node_id",
                           "get_if_exists", "max_task_retries"}
# Ray's name for the generator backpressure bound, kept so Ray code carries over.
BACKPRESSURE = "_generator_backpressure_num_objects"
TASK_OPTIONS = _COMMON | {"max_retries", "num_returns", BACKPRESSURE, "retry_exceptions"}
METHOD_OPTIONS = {"num_returns", BACKPRESSURE}


def validate(options: dict, allowed: set, what: str) -> dict:
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for {what}; "
                         f"valid options are {sorted(allowed)}")
    n = options.get("num_cpus")
    if n is not None and (not isinstance(n, (int, float)) or n < 0):
        raise ValueError(f"num_cpus must be a number >= 0, got {n!r}")
    res = options.get("resources")
    if res is not None:
        if not isinstance(res, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and v >= 0 for k, v in res.items()):
            raise ValueError(f"resources must be a dict of name -> amount >= 0, got {res!r}")
        if "CPU" in res:
            raise ValueError("give CPUs with num_cpus=..., not resources={'CPU': ...}")
        if "GPU" in res:
            check_gpus(res["GPU"], "resources['GPU']")
    if options.get("num_gpus") is not None:
        check_gpus(options["num_gpus"])
    if options.get("memory") is not None:
        check_memory(options["memory"])
    if "runtime_env" in options:
        # Checked here, at the call: a missing directory or a pip list fails now, not in a
        # worker. Relative paths are taken from the current directory, as in Ray.
        options["runtime_env"] = _runtime_env.validate(options["runtime_env"])
    for key in ("max_restarts", "max_retries", "max_task_retries"):
        v = options.get(key)
        if v is not None and (not isinstance(v, int) or v < -1):
            raise ValueError(f"{key} must be an int >= 0 (or -1 for unlimited), got {v!r}")
    nr = options.get("num_returns")
    if nr is not None and nr not in ("dynamic", "streaming") and (
            isinstance(nr, bool) or not isinstance(nr, int) or nr < 1):
        raise ValueError(f"num_returns must be an int >= 1, 'streaming' or 'dynamic', got {nr!r}")
    if options.get(BACKPRESSURE) is not None:
        check_backpressure(options[BACKPRESSURE], what)
    re_ = options.get("retry_exceptions")
    if re_ is not None and not isinstance(re_, bool) and not (
            isinstance(re_, (list, tuple))
            and all(isinstance(c, type) and issubclass(c, BaseException) for c in re_)):
        raise ValueError("retry_exceptions must be True/False or a list of exception classes "
                         f"(e.g. [ConnectionError, TimeoutError]), got {re_!r}")
    mc = options.get("max_concurrency")
    if mc is not None and (not isinstance(mc, int) or mc < 1):
        raise ValueError(f"max_concurrency must be an int >= 1, got {mc!r}")
    name = options.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        # "" would be accepted and then be unreachable: get_actor("") finds nothing.
        raise ValueError(f"name must be a non-empty string (or None for no name), got {name!r}")
    gie = options.get("get_if_exists")
    if gie is not None and not isinstance(gie, bool):
        raise ValueError(f"get_if_exists must be True or False, got {gie!r}")
    lt = options.get("lifetime")
    if lt not in (None, "detached"):
        raise ValueError(f"lifetime must be None or 'detached', got {lt!r}")
    strategy = options.get("scheduling_strategy")
    if strategy is not None:
        from ddlf_actors.util import scheduling_strategies

        scheduling_strategies.check(strategy)
        if options.get("node_id") is not None:
            raise ValueError("give either node_id=... or scheduling_strategy=..., not both "
                             "(NodeAffinitySchedulingStrategy(node_id, soft) pins to a node)")
    return options


def check_gpus(n, what: str = "num_gpus") -> None:
    """A GPU amount: a number >= 0, whole when above 1 (a fraction shares one GPU)."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
        raise ValueError(f"{what} must be a number >= 0, got {n!r}")
    if n > 1 and float(n) != int(n):
        raise ValueError(f"{what}={n!r}: above 1, ask for a whole number of GPUs (a fraction "
                         "below 1 shares one GPU with other work)")


def check_memory(n, what: str = "memory") -> None:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
        raise ValueError(f"{what} must be a number of bytes >= 0, got {n!r}")
