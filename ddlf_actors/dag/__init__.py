"""Lazy task graphs, as Ray's ``ray.dag``: build with ``.bind(...)``, run with ``.execute()``.

    from ddlf_actors.dag import InputNode, MultiOutputNode

    with InputNode() as inp:
        dag = combine.bind(double.bind(inp), inc.bind(inp))
    ddlf.get(dag.execute(3))                     # submits the three tasks

``dag.experimental_compile()`` gives a ``CompiledDAG`` with Ray's compiled-graph API;
in DDLF it runs through normal calls (no shared-memory channels).
"""

from .class_node import ClassMethodNode, ClassNode
from .compiled_dag_node import CompiledDAG, CompiledDAGFuture, CompiledDAGRef
from .dag_node import DAGNode, use_compiler
from .function_node import FunctionNode
from .input_data import DAGInputData
from .input_node import InputAttributeNode, InputNode
from .output_node import MultiOutputNode

__all__ = [
    "DAGNode", "FunctionNode", "ClassNode", "ClassMethodNode", "InputNode",
    "InputAttributeNode", "DAGInputData", "MultiOutputNode", "CompiledDAG",
    "CompiledDAGRef", "CompiledDAGFuture",
]

# DAGNode.experimental_compile makes a CompiledDAG; the base class cannot import the
# module built on it, so the package joins the two here.
use_compiler(CompiledDAG)
