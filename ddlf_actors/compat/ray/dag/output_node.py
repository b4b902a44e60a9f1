"""``ray.dag.output_node``: see ``ddlf_actors.dag.output_node``."""

from ddlf_actors.dag.output_node import MultiOutputNode

__all__ = ["MultiOutputNode"]
