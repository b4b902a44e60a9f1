"""``ray.dag.dag_node``: see ``ddlf_actors.dag.dag_node``."""

from ddlf_actors.dag.dag_node import DAGNode

__all__ = ["DAGNode"]
