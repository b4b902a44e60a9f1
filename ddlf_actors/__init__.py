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

import os as _os

# In a source checkout, runtime/ and apps/ sit next to this folder rather than inside
# it (setuptools maps them at install time). Let the checkout import itself too.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
        _os.path.join(_root, "runtime", "core.py")):
    __path__.append(_root)  # noqa: F821 - __path__ is defined for packages

from ddlf_actors import dag, errors, util  # noqa: E402
from ddlf_actors.actor import ActorClass, ActorHandle, ActorMethod, method  # noqa: E402
from ddlf_actors.api import (  # noqa: E402
    ClusterInfo,
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_actor,
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
from ddlf_actors.runtime.generators import (  # noqa: E402
    DynamicObjectRefGenerator,
    ObjectRefGenerator,
)
from ddlf_actors.runtime.object_ref import ObjectRef  # noqa: E402
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
