"""``ray.dag.class_node``: see ``ddlf_actors.dag.class_node``."""

from ddlf_actors.dag.class_node import ClassMethodNode, ClassNode

__all__ = ["ClassNode", "ClassMethodNode"]
