"""Resource arithmetic and node choice: pure functions, no I/O."""

from __future__ import annotations

__all__ = ["fits", "subtract", "add", "choose_node", "feasible_anywhere"]

_EPS = 1e-9


def fits(demand: dict, available: dict) -> bool:
    return all(available.get(k, 0.0) + _EPS >= v for k, v in demand.items() if v > 0)


def subtract(available: dict, demand: dict) -> None:
    for k, v in demand.items():
        if v > 0:
            available[k] = available.get(k, 0.0) - v


def add(available: dict, demand: dict, total: dict) -> None:
    for k, v in demand.items():
        if v > 0:
            available[k] = min(total.get(k, 0.0), available.get(k, 0.0) + v)


def feasible_anywhere(demand: dict, totals: list[dict]) -> bool:
    return any(fits(demand, t) for t in totals)


def choose_node(demand: dict, nodes: list, load_key=None):
    """Return the node (objects with ``.available``/``.total``) that fits ``demand`` and is
    least loaded (largest free CPU fraction, then fewest actors); ``None`` if none fits now."""
    best = None
    best_score = None
    for n in nodes:
        if not fits(demand, n.available):
            continue
        cpu_total = n.total.get("CPU", 0.0) or 1.0
        score = (n.available.get("CPU", 0.0) / cpu_total, -(load_key(n) if load_key else 0))
        if best is None or score > best_score:
            best, best_score = n, score
    return best
