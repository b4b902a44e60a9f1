"""What the dashboard shows, read from the head's managers: plain JSON-ready dicts.

Every function here only reads. The dashboard's HTTP side (``app.py``) serves what these
return and nothing else, so no request can change the head's state.
"""

from __future__ import annotations

import collections
import time

__all__ = ["nodes", "actors", "tasks", "placement_groups", "runs", "run", "snapshot"]

ACTORS_SHOWN = 1000   # rows in one /api/actors answer unless ?limit= says otherwise


def nodes(head) -> list[dict]:
    """Each node: address, resources total and used, heartbeat age, alive or dead."""
    out = []
    now = time.monotonic()
    for n in head.nodes.nodes.values():
        used = {k: round(v - n.available.get(k, 0.0), 6) for k, v in n.total.items()
                if not k.startswith("node:")}
        out.append({"node_id": n.node_id, "address": n.address, "alive": n.alive,
                    "pid": n.pid, "total": {k: v for k, v in n.total.items()
                                            if not k.startswith("node:")},
                    "used": used, "heartbeat_age_s": round(now - n.last_heartbeat, 3),
                    "num_actors": len(n.actors)})
    return out


def _actor(a) -> dict:
    return {"actor_id": a.actor_id, "class_name": a.class_name, "name": a.name or None,
            "state": a.state.value, "node_id": a.node.node_id if a.node else None,
            "pid": a.pid, "restarts": max(a.epoch - 1, 0),
            "death": a.death.reason if a.death is not None else None}


def actors(head, limit: int = ACTORS_SHOWN) -> dict:
    """Counts by state and class, and up to ``limit`` actors (live ones first)."""
    records = list(head.actors.actors.values())
    by_state = collections.Counter(a.state.value for a in records)
    by_class = collections.Counter(a.class_name for a in records)
    shown = sorted(records, key=lambda a: a.state.value == "DEAD")[:max(limit, 0)]
    return {"total": len(records), "by_state": dict(by_state), "by_class": dict(by_class),
            "actors": [_actor(a) for a in shown]}


def tasks(head) -> dict:
    """Task counts by state, as the head sees them.

    The head lends workers for tasks (leases); the calls themselves go from the caller to
    the leased worker without passing through it. So it counts workers running tasks,
    those whose task waits in ``get`` (their CPU is lent out), and task leases waiting
    for resources.
    """
    leases = head.leases.leases.values()
    lent = sum(1 for lease in leases if lease.lent)
    return {"RUNNING": len(head.leases.leases) - lent, "BLOCKED_IN_GET": lent,
            "WAITING_FOR_RESOURCES": head.placer.waiting_for("task"),
            "LEASES_GRANTED": head.leases.granted}


def placement_groups(head) -> list[dict]:
    alive = head.nodes.alive()
    out = []
    for g in head.groups.groups.values():
        v = head.groups.view(g, alive)
        out.append({"placement_group_id": v["placement_group_id"], "name": v["name"],
                    "strategy": v["strategy"], "state": v["state"],
                    "scheduling_state": v["stats"]["scheduling_state"],
                    "bundles": [v["bundles"][i] for i in sorted(v["bundles"])],
                    "nodes": [v["bundles_to_node_id"].get(i) for i in sorted(v["bundles"])]})
    return out


def runs(head) -> list[dict]:
    return head.dashboard.runs.summaries()


def run(head, run_id: str, since: int = 0) -> dict | None:
    r = head.dashboard.runs.get(run_id)
    return r.detail(since) if r is not None else None


def snapshot(head, actor_limit: int = 200) -> dict:
    """Everything the page shows but a run's curves, in one answer (one poll a second)."""
    return {"time": time.time(), "head": head.address, "nodes": nodes(head),
            "actors": actors(head, actor_limit), "tasks": tasks(head),
            "placement_groups": placement_groups(head), "runs": runs(head)}
