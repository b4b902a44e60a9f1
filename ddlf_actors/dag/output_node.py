"""``MultiOutputNode``: a graph with several outputs; ``execute`` returns a list."""

from __future__ import annotations

from .dag_node import DAGNode

__all__ = ["MultiOutputNode"]


class MultiOutputNode(DAGNode):
    """``MultiOutputNode([a, b])``: ``execute`` returns ``[output of a, output of b]``."""

    def __init__(self, args):
        if isinstance(args, tuple):
            args = list(args)
        if not isinstance(args, list):
            raise ValueError(f"MultiOutputNode takes a list of DAG nodes, got "
                             f"{type(args).__name__}")
        super().__init__(args, {}, {})

    def _execute_impl(self, outputs, dag_input):
        args, _ = self._resolved(outputs)
        return list(args)

    def __repr__(self):
        return f"MultiOutputNode({len(self._bound_args)} outputs)"
