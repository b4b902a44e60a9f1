"""DDLF: a Ray-style actor framework for distributed deep learning.

    import ddlf_actors as ddlf

    ddlf.init()                       # embedded local cluster (or ddlf.init("host:port"))

    @ddlf.remote
    class Counter:
        def __init__(self):
            self.n = 0
        def incr(self):
            self.n += 1
            return self.n

    c = Counter.remote()
    print(ddlf.get([c.incr.remote() for _ in range(3)]))   # [1, 2, 3]
"""


def _find_checkout_subpackages() -> None:
    """In a source checkout, find ``ddlf_actors.runtime`` and ``ddlf_actors.apps``.

    There the folders runtime/ and apps/ sit next to this package rather than inside it
    (setuptools maps them at install time, editable installs included). A finder for
    exactly those two names lets a checkout on ``PYTHONPATH`` import itself, and the
    nodes and workers it starts import the same code. It goes first on ``sys.meta_path``
    so that it also wins over an editable install of another checkout. Appending the
    repository root to ``__path__`` instead made every folder there a subpackage
    (``ddlf_actors.tests``, even ``ddlf_actors.ddlf_actors``).
    """
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if (os.path.isdir(os.path.join(here, "runtime"))
            or not os.path.isfile(os.path.join(root, "pyproject.toml"))
            or not os.path.isfile(os.path.join(root, "runtime", "client", "core.py"))):
        return   # an installed package: its subpackages are inside it

    class CheckoutFinder:
        folders = {"ddlf_actors.runtime": os.path.join(root, "runtime"),
                   "ddlf_actors.apps": os.path.join(root, "apps")}

        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            folder = cls.folders.get(fullname)
            if folder is None:
                return None
            return importlib.util.spec_from_file_location(
                fullname, os.path.join(folder, "__init__.py"),
                submodule_search_locations=[folder])

    CheckoutFinder.ddlf_checkout = root   # type: ignore[attr-defined]  # marks our finder
    if not any(getattr(f, "ddlf_checkout", None) == root for f in sys.meta_path):
        sys.meta_path.insert(0, CheckoutFinder)


_find_checkout_subpackages()

from ddlf_actors import dag, errors, util  # noqa: E402
from ddlf_actors.actor import ActorClass, ActorHandle, ActorMethod, method  # noqa: E402
from ddlf_actors.api import (  # noqa: E402
    ClusterInfo,
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_actor,
    get_gpu_ids,
    init,
    is_initialized,
    kill,
    nodes,
    put,
    remote,
    shutdown,
    wait,
)
from ddlf_actors.cluster import Cluster, WorkerProxy, read_config  # noqa: E402
from ddlf_actors.remote_function import RemoteFunction  # noqa: E402
from ddlf_actors.runtime import __version__  # noqa: E402
from ddlf_actors.runtime.client.generators import (  # noqa: E402
    DynamicObjectRefGenerator,
    ObjectRefGenerator,
)
from ddlf_actors.runtime.client.object_ref import ObjectRef  # noqa: E402
from ddlf_actors.runtime_context import RuntimeContext, get_runtime_context  # noqa: E402

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "remote",
    "method",
    "get",
    "wait",
    "put",
    "kill",
    "cancel",
    "get_actor",
    "get_runtime_context",
    "RuntimeContext",
    "nodes",
    "cluster_resources",
    "available_resources",
    "get_gpu_ids",
    "method",
    "ObjectRef",
    "ObjectRefGenerator",
    "DynamicObjectRefGenerator",
    "ActorHandle",
    "ActorClass",
    "ActorMethod",
    "RemoteFunction",
    "ClusterInfo",
    "Cluster",
    "WorkerProxy",
    "read_config",
    "errors",
    "util",
    "dag",
    "__version__",
]
