"""``ray._private.internal_api``: ``free`` and ``memory_summary`` over DDLF.

``free`` unpins objects pinned by out-of-band pickling (``cloudpickle.dump(ref, f)``).
``memory_summary`` lists the objects this process holds; unlike Ray's it does not
gather other processes' objects.
"""

from __future__ import annotations

from ddlf_actors.runtime.client import object_ref
from ddlf_actors.runtime.client.current import get_core
from ddlf_actors.runtime.client.object_store import LOCAL_ERR, OK, PENDING

from .._missing import missing

__all__ = ["free", "memory_summary"]

_STATES = {PENDING: "PENDING", OK: "READY", LOCAL_ERR: "FAILED"}


def free(object_refs, local_only: bool = False) -> None:
    """Unpin ``object_refs`` (one ref or a list) pinned by out-of-band pickling; each
    object is freed once no ref to it is left. DDLF frees nothing else early."""
    if isinstance(object_refs, object_ref.ObjectRef):
        object_refs = [object_refs]
    if not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"free() expects an ObjectRef or a list of them, got "
                        f"{type(object_refs).__name__}")
    object_ref.free(object_refs)


def memory_summary(address=None, redis_password=None, group_by="NODE_ADDRESS",
                   sort_by="OBJECT_SIZE", units="B", line_wrap=True, stats_only=False,
                   num_entries=None) -> str:
    """A table of the objects this process holds (id, state, bytes, local refs, pinned
    out of band). Ray's cluster-wide grouping and sorting options are ignored."""
    core = get_core(auto=False)
    if core is None:
        return "DDLF is not initialized in this process: it holds no objects."
    rows = []
    for obj_id, e in list(core.objects.items()):
        size = sum(memoryview(s).nbytes for s in e.segments or ())
        pinned = object_ref.pinned(obj_id) is not None
        rows.append((obj_id.hex(), _STATES.get(e.state, "FAILED"), size, e.refs, pinned))
    rows.sort(key=lambda r: -r[2])
    if num_entries is not None:
        rows = rows[:num_entries]
    lines = ["Objects held by this process (DDLF lists no other process's objects)",
             f"{'object id':<34}{'state':<9}{'bytes':>12}{'refs':>6}  pinned"]
    if not stats_only:
        lines += [f"{i:<34}{st:<9}{n:>12}{r:>6}  {'yes' if p else 'no'}"
                  for i, st, n, r, p in rows]
    lines.append(f"{len(rows)} objects, {sum(r[2] for r in rows)} bytes, "
                 f"{sum(r[4] for r in rows)} pinned out of band")
    return "\n".join(lines)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"_private.internal_api.{name}")
