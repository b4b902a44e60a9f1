"""``ClassNode`` (``Cls.bind(...)``) and ``ClassMethodNode`` (``node.m.bind(...)``,
``handle.m.bind(...)``): actors and their calls in a DAG.

As in Ray, a ``ClassNode`` creates a new actor on each ``execute``, and the methods
bound on one ``ClassNode`` run in the order they were bound, each after the previous
one, even when a call's result is not used by the graph's output: the output pulls in
every earlier call on that actor. A method bound on a live ``ActorHandle`` has no such
link: it runs on that actor, after the calls this process made to it earlier.
"""

from __future__ import annotations

from ddlf_actors.options import METHOD_OPTIONS, validate

from .dag_node import DAGNode
from .input_node import InputAttributeNode, InputNode

__all__ = ["ClassNode", "ClassMethodNode"]


class ClassNode(DAGNode):
    """An actor of ``Cls``, created with the bound arguments on each ``execute``."""

    def __init__(self, actor_class, args, kwargs, options):
        super().__init__(args, kwargs, options)
        self._body = actor_class
        self._last_call: ClassMethodNode | None = None
        if any(isinstance(n, (InputNode, InputAttributeNode)) for n in self._arg_nodes):
            raise ValueError(
                f"{actor_class.__name__}.bind(...) got the DAG's InputNode: an actor's "
                "constructor cannot read the input of dag.execute(). Pass the input to one "
                "of its methods instead")

    def _execute_impl(self, outputs, dag_input):
        args, kwargs = self._resolved(outputs)
        return self._body._create(self._bound_options, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        methods = self._body._get_spec().methods
        if name not in methods:
            if name == "bind":
                raise AttributeError(".bind() cannot be used again on a ClassNode")
            raise AttributeError(f"actor class {self._body.__name__} has no method {name!r}")
        return _UnboundClassMethodNode(self, name, {})

    def __repr__(self):
        return f"ClassNode({self._body.__name__})"


class _UnboundClassMethodNode:
    """``class_node.m``: call ``.bind(...)`` (or ``.options(...).bind(...)``) on it."""

    def __init__(self, actor: ClassNode, method_name: str, options: dict):
        self._actor = actor
        self._method_name = method_name
        self._options = options

    def options(self, **options) -> _UnboundClassMethodNode:
        validate(options, METHOD_OPTIONS, f"method {self._method_name}")
        return _UnboundClassMethodNode(self._actor, self._method_name,
                                       {**self._options, **options})

    def bind(self, *args, **kwargs) -> ClassMethodNode:
        node = ClassMethodNode(self._actor, self._method_name, args, kwargs, self._options,
                               previous=self._actor._last_call)
        self._actor._last_call = node
        return node

    def remote(self, *args, **kwargs):
        raise AttributeError(".remote() cannot be used on a method of a ClassNode: use "
                             ".bind() to add the call to the DAG")


class ClassMethodNode(DAGNode):
    """A call of ``method_name`` on the actor of a ``ClassNode`` or on an ``ActorHandle``."""

    def __init__(self, parent, method_name: str, args, kwargs, options, previous=None):
        super().__init__(args, kwargs, options, upstream=(parent, previous))
        self._parent = parent
        self._method_name = method_name

    def get_method_name(self) -> str:
        return self._method_name

    def _get_actor_handle(self):
        """The live actor this node calls, or None when a ``ClassNode`` makes it."""
        return None if isinstance(self._parent, DAGNode) else self._parent

    def _execute_impl(self, outputs, dag_input):
        handle = self._parent
        if isinstance(handle, DAGNode):
            handle = outputs[id(handle)]
        return self._call(handle, outputs)

    def _call(self, handle, outputs):
        method = getattr(handle, self._method_name)
        if self._bound_options:
            method = method.options(**self._bound_options)
        args, kwargs = self._resolved(outputs)
        return method.remote(*args, **kwargs)

    def __repr__(self):
        return f"ClassMethodNode({self._method_name})"
