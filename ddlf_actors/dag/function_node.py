"""``FunctionNode``: ``f.bind(...)``, a remote function call in a DAG."""

from __future__ import annotations

from .dag_node import DAGNode

__all__ = ["FunctionNode"]


class FunctionNode(DAGNode):
    """A task: each ``execute`` submits ``f`` once with its bound arguments."""

    def __init__(self, remote_function, args, kwargs, options):
        super().__init__(args, kwargs, options)
        self._body = remote_function

    def _execute_impl(self, outputs, dag_input):
        args, kwargs = self._resolved(outputs)
        return self._body._submit(self._bound_options, args, kwargs)

    def __repr__(self):
        return f"FunctionNode({self._body.__name__})"
