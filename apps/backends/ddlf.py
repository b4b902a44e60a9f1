"""The DDLF backend: the public ``ddlf_actors`` API, call for call."""

from __future__ import annotations

import ddlf_actors as ddlf
from ddlf_actors.util import (
    PlacementGroupSchedulingStrategy,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from .base import Backend

__all__ = ["DDLFBackend"]


class DDLFBackend(Backend):
    name = "ddlf"
    publishes_runs = True

    def ensure_session(self) -> bool:
        if ddlf.is_initialized():
            return False
        ddlf.init()
        return True

    def shutdown(self) -> None:
        ddlf.shutdown()

    def is_initialized(self) -> bool:
        return ddlf.is_initialized()

    def remote(self, cls, **options):
        return ddlf.remote(**options)(cls)

    def get(self, refs, *, timeout=None):
        return ddlf.get(refs, timeout=timeout)   # already raises DDLF's ActorDiedError

    def put(self, value):
        return ddlf.put(value)

    def wait(self, refs, *, num_returns=1, timeout=None):
        return ddlf.wait(list(refs), num_returns=num_returns, timeout=timeout)

    def kill(self, handle) -> None:
        ddlf.kill(handle)

    def placement_group(self, bundles, strategy):
        return placement_group(bundles, strategy=strategy)

    def placement_group_table(self, group) -> dict:
        return placement_group_table(group)

    def remove_placement_group(self, group) -> None:
        remove_placement_group(group)

    def in_bundle(self, group, index):
        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

    def nodes(self):
        return ddlf.nodes()

    def cluster_resources(self):
        return ddlf.cluster_resources()

    def available_resources(self):
        return ddlf.available_resources()

    def node_id(self):
        try:
            return ddlf.get_runtime_context().get_node_id()
        except Exception:   # outside a worker and without a session (a trainer in a test)
            return None
