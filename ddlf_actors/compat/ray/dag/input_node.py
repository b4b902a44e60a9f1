"""``ray.dag.input_node``: see ``ddlf_actors.dag.input_node``."""

from ddlf_actors.dag.input_data import DAGInputData
from ddlf_actors.dag.input_node import InputAttributeNode, InputNode

__all__ = ["InputNode", "InputAttributeNode", "DAGInputData"]
