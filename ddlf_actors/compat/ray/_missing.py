"""What the Ray layer does not provide, and why: one table used by every error it raises."""

from __future__ import annotations

import dis
import importlib
import sys

__all__ = ["NotProvidedError", "NotProvidedModuleError", "reason", "not_provided", "missing",
           "module_getattr"]

_LIBRARY = "a Ray library built on Ray Core; DDLF provides only the Core API"

# Ray name (as written after ``ray.``) -> why DDLF does not provide it.
_REASONS = {
    # Ray libraries and subsystems
    "data": _LIBRARY, "serve": _LIBRARY, "tune": _LIBRARY, "train": _LIBRARY,
    "rllib": _LIBRARY, "air": _LIBRARY, "workflow": _LIBRARY, "llm": _LIBRARY,
    "dag": "DDLF's ray.dag has the DAG nodes and compiled graphs only",
    "experimental": "DDLF's ray.experimental has tqdm_ray only (channels and the rest are "
                    "missing); compiled graphs are dag.experimental_compile()",
    "autoscaler": "DDLF clusters are started by hand with `ddlf-node start`; there is no autoscaler",
    "job_submission": "DDLF has no job server; run the driver script directly",
    "client": "DDLF has no Ray Client (ray://); connect with ray.init('host:port')",
    "ClientBuilder": "DDLF has no Ray Client (ray://); connect with ray.init('host:port')",
    "cluster_utils": "DDLF's test clusters are started with ddlf_actors.runtime.local_cluster",
    "widgets": "DDLF has no notebook widgets",
    "internal": "DDLF does not expose Ray's internal state API",
    "_private": "DDLF does not expose Ray's private modules",
    "_raylet": "DDLF does not expose Ray's private modules",
    "_config": "DDLF does not expose Ray's private modules",
    # Core functions and types
    "timeline": "DDLF records no task timeline",
    "cpp_function": "DDLF runs Python only", "java_function": "DDLF runs Python only",
    "java_actor_class": "DDLF runs Python only", "Language": "DDLF runs Python only",
    "cross_language": "DDLF runs Python only",
    "LoggingConfig": "DDLF has no structured-logging configuration",
    "ActorClassID": "DDLF ids are plain hex strings", "ActorID": "DDLF ids are plain hex strings",
    "FunctionID": "DDLF ids are plain hex strings", "JobID": "DDLF ids are plain hex strings",
    "NodeID": "DDLF ids are plain hex strings", "ObjectID": "DDLF ids are plain hex strings",
    "PlacementGroupID": "DDLF ids are plain hex strings", "TaskID": "DDLF ids are plain hex strings",
    "UniqueID": "DDLF ids are plain hex strings", "WorkerID": "DDLF ids are plain hex strings",
    "SCRIPT_MODE": "DDLF has no worker modes", "WORKER_MODE": "DDLF has no worker modes",
    "__version__": "DDLF is not Ray; see ddlf_actors.__version__",
    # ray.util
    "util.as_completed": "not provided yet; use ray.wait in a loop",
    "util.map_unordered": "not provided yet; use ray.util.ActorPool.map_unordered",
    "util.inspect_serializability": "not provided; pickle the object with cloudpickle to test it",
    "util.register_serializer": "DDLF serializes with cloudpickle only",
    "util.deregister_serializer": "DDLF serializes with cloudpickle only",
    "util.get_node_ip_address": "not provided yet",
    "util.get_node_instance_id": "DDLF has no cloud instance metadata",
    "util.connect": "DDLF has no Ray Client", "util.disconnect": "DDLF has no Ray Client",
    "util.pdb": "DDLF has no remote debugger", "util.ray_debugpy": "DDLF has no remote debugger",
    "util.log_once": "not provided", "util.disable_log_once_globally": "not provided",
    "util.enable_periodic_logging": "not provided",
    "util.accelerators": "DDLF assigns NVIDIA GPUs (num_gpus) only; no accelerator types",
    "util.collective": "DDLF has no collective communication library",
    "util.state": "DDLF has no state API (use ddlf.nodes() for nodes)",
    "util.metrics": "DDLF exports no metrics",
    "util.multiprocessing": "DDLF has no multiprocessing.Pool on actors",
    "util.iter": "DDLF has no parallel iterators",
    "util.dask": "DDLF has no Dask scheduler", "util.joblib": "DDLF has no joblib backend",
    "util.spark": "DDLF has no Spark integration", "util.tracing": "DDLF has no tracing",
    "util.annotations": "DDLF does not expose Ray's API annotations",
    "util.check_serialize": "not provided",
    "util.scheduling_strategies.NodeLabelSchedulingStrategy": "DDLF has no node labels",
    "get_runtime_context().get_accelerator_ids": "DDLF does not assign accelerator ids",
    "get_runtime_context().runtime_env": "DDLF has no runtime environments",
    "get_runtime_context().get_runtime_env_string": "DDLF has no runtime environments",
    "get_runtime_context().get_node_labels": "DDLF has no node labels",
}

_DEFAULT = "DDLF does not implement it"


def reason(name: str) -> str:
    """Why ``ray.<name>`` is missing; ``name`` is dotted below ``ray`` (``util.state``)."""
    key = name
    while key:
        if key in _REASONS:
            return _REASONS[key]
        key = key.rpartition(".")[0]
    return _DEFAULT


def not_provided(name: str) -> str:
    return (f"ray.{name} is not provided by DDLF's Ray compatibility layer "
            f"(ddlf_actors.compat.ray): {reason(name)}. See docs/ray-compat.md.")


class NotProvidedError(AttributeError, NotImplementedError):
    """A Ray name DDLF does not provide (also an ``AttributeError``, so ``hasattr`` is False)."""


class NotProvidedModuleError(ModuleNotFoundError):
    """``import ray.<module>`` for a module DDLF does not provide."""


_IMPORT_FROM = dis.opmap.get("IMPORT_FROM")


def missing(name: str, depth: int = 2) -> BaseException:
    """The error for a module ``__getattr__`` to raise for ``ray.<name>``.

    ``from ray import X`` turns an ``AttributeError`` into a bare "cannot import name" that
    drops our reason, so when the caller (``depth`` frames up) is executing that
    import, return an ``ImportError`` instead; otherwise an ``AttributeError``.
    """
    msg = not_provided(name)
    try:
        frame = sys._getframe(depth)
        if frame.f_code.co_code[frame.f_lasti] == _IMPORT_FROM:
            return NotProvidedModuleError(msg, name=f"ray.{name}")
    except (ValueError, IndexError, AttributeError):
        pass
    return NotProvidedError(msg)


def module_getattr(package: str, prefix: str, submodules: tuple = ()):
    """A module ``__getattr__`` for a package of the Ray layer: its ``submodules`` load on
    first use, as in Ray; any other public name raises :func:`missing` for
    ``ray.<prefix><name>``."""
    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing(f"{prefix}{name}")   # depth 2: the frame that asked for the name

    return __getattr__
