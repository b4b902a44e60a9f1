"""``ray.dag.function_node``: see ``ddlf_actors.dag.function_node``."""

from ddlf_actors.dag.function_node import FunctionNode

__all__ = ["FunctionNode"]
