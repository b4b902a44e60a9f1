"""``CompiledDAG``: Ray's compiled graphs (``dag.experimental_compile()``) over DDLF.

Ray compiles a graph of actor calls into shared-memory channels and loops that run on
the actors, so an ``execute`` costs no task submission. DDLF has no channels: compiling
checks the graph once (what Ray's compiler rejects is rejected here too), orders its
nodes once and creates the actors of any ``ClassNode`` once; each ``execute`` then
submits the calls through normal actor calls. Same results, no channel speed-up.
"""

from __future__ import annotations

from ddlf_actors import autoinit
from ddlf_actors.runtime.client.object_ref import ObjectRef
from ddlf_actors.runtime.errors import DDLFError

from .class_node import ClassMethodNode, ClassNode
from .dag_node import DAGNode, run_graph, topological_order
from .function_node import FunctionNode
from .input_node import InputAttributeNode, InputNode
from .output_node import MultiOutputNode

__all__ = ["CompiledDAG", "CompiledDAGRef", "CompiledDAGFuture"]


class CompiledDAGRef(ObjectRef):
    """The result of one ``CompiledDAG.execute``; read it with ``get`` (or ``await``).

    As in Ray, it cannot be pickled, copied or passed to a task.
    """

    __slots__ = ("_dag",)

    def __init__(self, dag: CompiledDAG, ref: ObjectRef):
        super().__init__(ref.id, ref._core)
        self._dag = dag

    def get(self, timeout: float | None = None):
        return self._core.get([self], timeout)[0]

    def __reduce__(self):
        raise ValueError("CompiledDAGRef cannot be pickled or passed to a task: get() its "
                         "value and pass that")

    def __copy__(self):
        raise ValueError("CompiledDAGRef cannot be copied")

    def __deepcopy__(self, memo):
        raise ValueError("CompiledDAGRef cannot be deep copied")

    def __repr__(self):
        return f"CompiledDAGRef({self.id.hex()})"


class CompiledDAGFuture:
    """The result of one ``CompiledDAG.execute_async``: ``await`` it for the value."""

    def __init__(self, ref: CompiledDAGRef):
        self._ref = ref

    def __await__(self):
        return self._ref.__await__()

    def __reduce__(self):
        raise ValueError("CompiledDAGFuture cannot be pickled: await it and pass the value")

    def __repr__(self):
        return f"CompiledDAGFuture({self._ref.id.hex()})"


class CompiledDAG:
    """A DAG checked and ordered once, then run many times with :meth:`execute`."""

    def __init__(self, root: DAGNode, *, enable_asyncio: bool = False):
        order = topological_order(root)
        _check(order, root)
        self._enable_asyncio = enable_asyncio
        self._root = root
        self._order = [n for n in order if not isinstance(n, ClassNode)]
        self._nodes = order
        self._torn_down = False
        # Ray accepts only actors made with Actor.remote(); DDLF also takes Actor.bind()
        # and makes those actors here, once, for every execute of this graph.
        self._preset: dict = {}
        self._owned: list = []
        for node in order:
            if isinstance(node, ClassNode):
                handle = node._execute_impl(self._preset, None)
                self._preset[id(node)] = handle
                self._owned.append(handle)

    def execute(self, *args, **kwargs):
        """Run the graph once; a ``CompiledDAGRef`` (a list of them for a
        ``MultiOutputNode``). ``get`` it as an ``ObjectRef``."""
        if self._enable_asyncio:
            raise ValueError("this graph was compiled with enable_asyncio=True: use "
                             "await compiled.execute_async(...)")
        return self._submit(args, kwargs)

    async def execute_async(self, *args, **kwargs):
        """Run the graph once; a ``CompiledDAGFuture`` (or a list) to ``await``."""
        if not self._enable_asyncio:
            raise ValueError("use execute(), or compile with "
                             "experimental_compile(enable_asyncio=True) to use execute_async")
        out = self._submit(args, kwargs)
        if isinstance(out, list):
            return [CompiledDAGFuture(r) for r in out]
        return CompiledDAGFuture(out)

    def _submit(self, args, kwargs):
        if self._torn_down:
            raise DDLFError("this compiled DAG was torn down; compile the DAG again with "
                            "dag.experimental_compile()")
        return self._wrap(run_graph(self._order, self._root, args, kwargs, self._preset))

    def _wrap(self, value):
        if isinstance(value, list):
            return [self._wrap(v) for v in value]
        if type(value) is not ObjectRef:
            # The graph's output is an input value or an actor: hand it back as a ref too.
            value = autoinit.core().put(value)
        return CompiledDAGRef(self, value)

    def teardown(self, kill_actors: bool = False) -> None:
        """Stop accepting ``execute`` calls. Kills the actors this graph made from
        ``Actor.bind(...)``; with ``kill_actors=True`` also those it was given."""
        if self._torn_down:
            return
        self._torn_down = True
        victims = list(self._owned)
        if kill_actors:
            for node in self._nodes:
                handle = node._get_actor_handle() if isinstance(node, ClassMethodNode) else None
                if handle is not None and handle not in victims:
                    victims.append(handle)
        for handle in victims:
            autoinit.core().kill_actor(handle._actor_id, True)

    def __del__(self):
        # No remote calls here: a garbage collection may run on DDLF's I/O thread.
        self._torn_down = True

    def visualize(self, filename: str = "compiled_graph", format: str = "png",
                  view: bool = False, channel_details: bool = False) -> str:
        """Draw the graph: ``format="ascii"`` returns (and with ``view``, prints) a text
        listing; other formats need the ``graphviz`` package and return the DOT source
        after rendering ``filename.format``. DDLF has no channels, so
        ``channel_details`` is refused."""
        if channel_details:
            raise NotImplementedError("visualize(channel_details=True): DDLF's compiled "
                                      "graphs have no channels to describe")
        if format == "ascii":
            text = self._ascii()
            if view:
                print(text)
            return text
        try:
            import graphviz
        except ImportError:
            raise ImportError("Please install graphviz to visualize the compiled graph "
                              "(`pip install graphviz`, and the Graphviz `dot` program), or "
                              "use visualize(format='ascii')") from None
        source = self._dot()
        graphviz.Source(source, format=format).render(filename, view=view)
        return source

    def _labels(self) -> tuple[dict, list]:
        index = {id(n): i for i, n in enumerate(self._nodes)}
        labels = {}
        edges = []
        for i, node in enumerate(self._nodes):
            labels[i] = _label(node, self._preset)
            for child in node._children():
                edges.append((index[id(child)], i))
        return labels, edges

    def _ascii(self) -> str:
        labels, edges = self._labels()
        inputs: dict = {}
        for src, dst in edges:
            inputs.setdefault(dst, []).append(src)
        lines = []
        for i, label in labels.items():
            src = ", ".join(str(s) for s in inputs.get(i, ()))
            lines.append(f"{i}: {label}" + (f" <- {src}" if src else ""))
        return "\n".join(lines)

    def _dot(self) -> str:
        labels, edges = self._labels()
        out = ["digraph compiled_graph {"]
        for i, label in labels.items():
            text = label.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'  {i} [label="{i}: {text}"];')
        out.extend(f"  {s} -> {d};" for s, d in edges)
        out.append("}")
        return "\n".join(out)


def _label(node: DAGNode, preset: dict) -> str:
    if isinstance(node, ClassMethodNode):
        handle = node._get_actor_handle() or preset.get(id(node._parent))
        who = f"{handle._class_name} {handle._actor_id[:6]}" if handle is not None else "?"
        return f"{who}.{node.get_method_name()}()"
    if isinstance(node, InputAttributeNode):
        return f"InputNode[{node.key!r}]"
    if isinstance(node, ClassNode):
        return f"{node._body.__name__} (actor made at compile)"
    return type(node).__name__


def _check(order: list, root: DAGNode) -> None:
    """Reject what Ray's compiler rejects, with the reason."""
    if sum(isinstance(n, InputNode) for n in order) != 1:
        raise ValueError("Compiled DAGs need exactly one InputNode: bind the graph inside "
                         "`with InputNode() as inp:` and read the input from inp")
    for node in order:
        if isinstance(node, FunctionNode):
            raise NotImplementedError(
                f"compiled graphs run actor method calls only, as in Ray, and this graph "
                f"has a task ({node._body.__name__}.bind); run it without compiling "
                "(dag.execute()), or make the function an actor method")
        if isinstance(node, MultiOutputNode) and node is not root:
            raise ValueError("a MultiOutputNode can only be the output of a compiled graph")
        if isinstance(node, ClassNode) and not all(
                isinstance(c, ClassNode) for c in node._arg_nodes):
            raise ValueError(f"{node._body.__name__}.bind(...) in a compiled graph can only "
                             "take other Actor.bind(...) nodes as arguments: its actor is "
                             "created once, at compile time")
