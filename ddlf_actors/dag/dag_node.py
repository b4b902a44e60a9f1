"""``DAGNode``: one lazy call in a task graph, and the walk that submits a graph.

``f.bind(...)``, ``Cls.bind(...)`` and ``handle.m.bind(...)`` build nodes instead of
submitting anything. ``node.execute(*args, **kwargs)`` then submits every node the root
depends on through DDLF's normal API (``.remote()``), children first, and returns what
the root yields: an ``ObjectRef`` for a call, a list for ``MultiOutputNode``, an
``ActorHandle`` for a ``ClassNode``. Within one ``execute`` a node shared by several
others runs once; each ``execute`` runs the whole graph again (new actors for
``ClassNode``s included), as in Ray.

DAG nodes are found in a node's arguments at the top level and inside lists, tuples and
dicts (a node nested that way reaches the callee as an ``ObjectRef``, as in Ray).
"""

from __future__ import annotations

import uuid

from .input_data import DAGInputData

__all__ = ["DAGNode", "use_compiler"]

# What experimental_compile builds: CompiledDAG, set by the package (dag/__init__.py).
# compiled_dag_node builds on this module, so this one must not import it back.
_compiler = None


def use_compiler(compiler) -> None:
    """Make ``compiler(root, enable_asyncio=...)`` what ``experimental_compile`` returns."""
    global _compiler
    _compiler = compiler

# Transports that change nothing in DDLF: it has no GPU channels, and same-host values
# already travel through shared memory (runtime/shm_store.py).
_NO_OP_TRANSPORTS = ("auto", "shm")


class DAGNode:
    """A node of a lazy task graph. Run the graph with :meth:`execute`."""

    _is_input = False   # the graph's InputNode (at most one per graph)

    def __init__(self, args, kwargs, options, upstream=()):
        self._bound_args = tuple(args)
        self._bound_kwargs = dict(kwargs or {})
        self._bound_options = dict(options or {})
        # Nodes that must be submitted before this one without being passed to it (the
        # actor a method runs on, the previous call bound on the same ClassNode).
        self._upstream = tuple(n for n in upstream if isinstance(n, DAGNode))
        # Scanned once at bind time: nodes are never changed after it.
        self._arg_nodes = _find_nodes((self._bound_args, self._bound_kwargs))
        self._stable_uuid = uuid.uuid4().hex

    # -- Ray's accessors -------------------------------------------------------------------
    def get_args(self) -> tuple:
        return self._bound_args

    def get_kwargs(self) -> dict:
        return dict(self._bound_kwargs)

    def get_options(self) -> dict:
        return dict(self._bound_options)

    def get_stable_uuid(self) -> str:
        return self._stable_uuid

    # -- running ---------------------------------------------------------------------------
    def execute(self, *args, **kwargs):
        """Submit this graph; ``args``/``kwargs`` feed its ``InputNode``.

        Returns an ``ObjectRef`` (a list of them for a ``MultiOutputNode``, or for a
        method bound with ``num_returns=k``; an ``ActorHandle`` for a ``ClassNode``).
        Errors of the calls surface at ``get``, as for ``.remote()``.
        """
        return run_graph(topological_order(self), self, args, kwargs)

    def experimental_compile(self, _submit_timeout=None, _buffer_size_bytes=None,
                             enable_asyncio: bool = False, _max_inflight_executions=None,
                             _max_buffered_results=None, _overlap_gpu_communication=None,
                             _default_communicator="create"):
        """A :class:`~ddlf_actors.dag.CompiledDAG` of this graph (Ray's compiled graphs).

        DDLF has no shared-memory channels: the graph is checked and ordered once here,
        and each ``execute`` runs through normal actor calls. The underscored tuning
        arguments of Ray's compiled graphs are accepted and have no effect.
        """
        if _overlap_gpu_communication:
            raise NotImplementedError("experimental_compile(_overlap_gpu_communication=True): "
                                      "DDLF has no GPU communication to overlap")
        if _compiler is None:   # dag/__init__ sets it: importing this module imports it
            raise RuntimeError("ddlf_actors.dag was not imported")
        return _compiler(self, enable_asyncio=enable_asyncio)

    def with_tensor_transport(self, transport="auto", device="default",
                              _static_shape: bool = False, _direct_return: bool = False):
        """Ray's torch tensor transport. Only ``"auto"``/``"shm"`` on the default device
        are accepted (they change nothing in DDLF); NCCL and accelerators are missing."""
        if transport in _NO_OP_TRANSPORTS and device == "default":
            return self
        raise NotImplementedError(
            f"with_tensor_transport(transport={transport!r}, device={device!r}): DDLF has no "
            "GPU tensor transport (NCCL, accelerator or custom communicators); tensors "
            "travel as ordinary pickled values. Drop the call, or use transport='auto'")

    def with_type_hint(self, typ):
        raise NotImplementedError(
            f"with_type_hint({type(typ).__name__}): DDLF has no typed channels (torch "
            "tensor type hints, NCCL); values travel as ordinary pickled values. Drop the "
            "call")

    def _execute_impl(self, outputs: dict, dag_input):
        """This node's output, once every node it depends on is in ``outputs``."""
        raise NotImplementedError

    def _resolved(self, outputs: dict):
        """``(args, kwargs)`` with each DAG node replaced by its output."""
        if not self._arg_nodes:
            return self._bound_args, self._bound_kwargs
        return (_replace(self._bound_args, outputs), _replace(self._bound_kwargs, outputs))

    def _children(self) -> list:
        return [*self._arg_nodes, *self._upstream]

    def __getattr__(self, name: str):
        if name == "bind":
            raise AttributeError(f".bind() cannot be used again on {type(self).__name__}")
        if name == "remote":
            raise AttributeError(f".remote() cannot be used on {type(self).__name__}: to run "
                                 "the graph of this node, use .execute()")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __reduce__(self):
        # A node pickled into a call's arguments would be a silent no-op at the callee.
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled: DDLF finds DAG nodes in bind() "
            "arguments at the top level and inside lists, tuples and dicts only; put it "
            "in one of those")


def _find_nodes(value) -> list:
    found: list = []
    seen: set = set()

    def visit(v):
        if isinstance(v, DAGNode):
            if id(v) not in seen:
                seen.add(id(v))
                found.append(v)
        elif type(v) in (list, tuple):
            for x in v:
                visit(x)
        elif type(v) is dict:
            for x in v.values():
                visit(x)

    visit(value)
    return found


def _replace(value, outputs: dict):
    if isinstance(value, DAGNode):
        return outputs[id(value)]
    t = type(value)
    if t is list:
        return [_replace(v, outputs) for v in value]
    if t is tuple:
        return tuple(_replace(v, outputs) for v in value)
    if t is dict:
        return {k: _replace(v, outputs) for k, v in value.items()}
    return value


def topological_order(root: DAGNode) -> list:
    """Every node ``root`` depends on, each after the nodes it depends on, root last.

    Iterative, so a long chain of calls does not hit the recursion limit. Raises
    ``ValueError`` if the graph holds two different ``InputNode``s (Ray allows one).
    """
    order: list = []
    done: set = set()
    on_path: set = set()
    stack = [(root, iter(root._children()))]
    on_path.add(id(root))
    inputs = set()
    while stack:
        node, it = stack[-1]
        for child in it:
            if id(child) in done:
                continue
            if id(child) in on_path:   # cannot happen through bind(); guard anyway
                raise ValueError(f"the DAG has a cycle through {child!r}")
            on_path.add(id(child))
            stack.append((child, iter(child._children())))
            break
        else:
            stack.pop()
            on_path.discard(id(node))
            done.add(id(node))
            order.append(node)
            if node._is_input:
                inputs.add(id(node))
    if len(inputs) > 1:
        raise ValueError("each DAG can have only one InputNode; bind every node that "
                         "reads the input to the same `with InputNode() as inp:`")
    return order


def run_graph(order: list, root: DAGNode, args, kwargs, preset: dict | None = None):
    """Submit the nodes of ``order`` (from :func:`topological_order`); root's output.

    ``preset`` holds the outputs of nodes already run (a compiled graph's actors),
    keyed by ``id(node)``; those nodes are left out of ``order``.
    """
    dag_input = args[0] if len(args) == 1 and not kwargs else DAGInputData(*args, **kwargs)
    outputs: dict = dict(preset) if preset else {}
    for node in order:
        outputs[id(node)] = node._execute_impl(outputs, dag_input)
    return outputs[id(root)]
