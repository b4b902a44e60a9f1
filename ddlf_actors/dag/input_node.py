"""``InputNode``: where the arguments of ``dag.execute(...)`` enter a graph.

``dag.execute(x)`` gives the graph ``x`` itself; ``dag.execute(1, y=2)`` gives a
``DAGInputData`` read with ``inp[0]`` and ``inp.y`` (or ``inp["y"]``). With a single
value, ``inp[k]`` indexes it and ``inp.k`` reads its attribute, as in Ray.
"""

from __future__ import annotations

from .dag_node import DAGNode
from .input_data import DAGInputData

__all__ = ["InputNode", "InputAttributeNode", "DAGInputData"]


class InputNode(DAGNode):
    """The input of a DAG; use it as a context manager: ``with InputNode() as inp:``."""

    _is_input = True

    def __init__(self, *args, input_type=None, **kwargs):
        if args or kwargs:
            raise ValueError("InputNode() takes no arguments: the input is given to "
                             "dag.execute(...) instead")
        super().__init__((), {}, {})
        self.input_type = input_type
        self._in_context = False
        self._attribute_nodes: dict = {}

    def __enter__(self):
        self._in_context = True
        return self

    def __exit__(self, *exc):
        return None

    def _execute_impl(self, outputs, dag_input):
        if not self._in_context:
            # Ray's rule: one input per graph, made explicit by the with-block.
            raise ValueError("an InputNode must be created in a `with InputNode() as inp:` "
                             "block before the DAG that reads it is executed")
        return dag_input

    def _attribute(self, key, accessor: str) -> InputAttributeNode:
        node = self._attribute_nodes.get((key, accessor))
        if node is None:
            node = self._attribute_nodes[(key, accessor)] = InputAttributeNode(self, key,
                                                                               accessor)
        return node

    def __getattr__(self, key: str):
        if key.startswith("_"):
            raise AttributeError(key)
        return self._attribute(key, "__getattr__")

    def __getitem__(self, key):
        if not isinstance(key, (int, str)):
            raise TypeError(f"index a DAG input with an int or a str, not {type(key).__name__}")
        return self._attribute(key, "__getitem__")

    def __repr__(self):
        return "InputNode()"


class InputAttributeNode(DAGNode):
    """``inp[key]`` or ``inp.key``: part of the DAG's input."""

    def __init__(self, input_node: InputNode, key, accessor: str):
        super().__init__((), {}, {}, upstream=(input_node,))
        self._input_node = input_node
        self.key = key
        self._accessor = accessor

    def _execute_impl(self, outputs, dag_input):
        value = outputs[id(self._input_node)]
        key = self.key
        if isinstance(value, DAGInputData):
            return value[key]
        if isinstance(key, str) and self._accessor == "__getattr__":
            return getattr(value, key)
        return value[key]

    def __repr__(self):
        return f"InputNode()[{self.key!r}]"
