"""``ray.dag.compiled_dag_node``: see ``ddlf_actors.dag.compiled_dag_node``."""

from ddlf_actors.dag.compiled_dag_node import CompiledDAG, CompiledDAGFuture, CompiledDAGRef

__all__ = ["CompiledDAG", "CompiledDAGRef", "CompiledDAGFuture"]
