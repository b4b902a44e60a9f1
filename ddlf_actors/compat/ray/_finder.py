"""Make ``import ray`` (and ``ray.util``, ``ray.exceptions``, ...) load DDLF's Ray layer.

A meta-path finder maps ``ray.X`` to ``ddlf_actors.compat.ray.X``. The module it returns
keeps its real name, so cloudpickle pickles a reference to ``ray`` as a reference to
``ddlf_actors.compat.ray``, and a worker that unpickles it needs no finder. A Ray module
that DDLF lacks fails with ``NotProvidedModuleError`` naming it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

from ._missing import NotProvidedModuleError, not_provided

__all__ = ["install", "uninstall", "RayAliasFinder", "ENV_VAR"]

# Set by `python -m ddlf_actors.compat.ray`; processes of the embedded cluster inherit it,
# so a worker that imports this layer (to run the script's code) answers to "ray" too.
ENV_VAR = "DDLF_RAY_COMPAT"
_TARGET = "ddlf_actors.compat.ray"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        # The real module object, not a copy: `ray.util is ddlf_actors.compat.ray.util`.
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # already executed under its real name


class RayAliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "ray" and not fullname.startswith("ray."):
            return None
        real = _TARGET + fullname[len("ray"):]
        try:
            found = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            found = None
        if found is None:
            raise NotProvidedModuleError(not_provided(fullname[len("ray."):]), name=fullname)
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(real),
                                              is_package=found.submodule_search_locations
                                              is not None)
        return spec


_finder = RayAliasFinder()


def install() -> None:
    """Route ``import ray...`` to DDLF's Ray layer in this process (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    real = sys.modules.get("ray")
    if real is not None and getattr(real, "__name__", "") != _TARGET:
        raise RuntimeError("the real Ray is already imported in this process; install the "
                           "DDLF Ray layer before anything imports ray")
    os.environ[ENV_VAR] = "1"


def uninstall() -> None:
    """Undo :func:`install` (for tests): forget the finder and the ``ray`` aliases."""
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in [n for n in sys.modules if n == "ray" or n.startswith("ray.")]:
        if getattr(sys.modules[name], "__name__", "").startswith(_TARGET):
            del sys.modules[name]
    os.environ.pop(ENV_VAR, None)
