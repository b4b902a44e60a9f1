"""``ray.dag``: DDLF's lazy task graphs (``ddlf_actors.dag``) under Ray's names.

``experimental_compile()`` gives the compiled-graph API; it runs through normal actor
calls (DDLF has no shared-memory channels), so results match Ray's, not its latency.
"""

from ddlf_actors.dag import (
    ClassMethodNode,
    ClassNode,
    CompiledDAG,
    DAGInputData,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)

from .._missing import module_getattr

__all__ = ["DAGNode", "FunctionNode", "ClassNode", "ClassMethodNode", "InputNode",
           "InputAttributeNode", "DAGInputData", "MultiOutputNode", "CompiledDAG"]


__getattr__ = module_getattr(__name__, "dag.")
