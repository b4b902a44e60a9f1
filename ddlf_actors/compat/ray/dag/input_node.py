"""``ray.dag.input_node``: see ``ddlf_actors.dag.input_node``."""

from ddlf_actors.dag.input_node import DAGInputData, InputAttributeNode, InputNode

__all__ = ["InputNode", "InputAttributeNode", "DAGInputData"]
