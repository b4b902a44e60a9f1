"""Ray Core's public API over DDLF: ``import ddlf_actors.compat.ray as ray``.

The names a Ray program uses most (``init``, ``remote``, ``get``, ``wait``, ``put``,
``kill``, ``get_actor``, ``nodes``, ``method``, ``ObjectRef``, ``ObjectRefGenerator``,
``DynamicObjectRefGenerator``, ``exceptions``, ``util``)
map onto DDLF; a Ray name DDLF lacks raises an error naming it and saying why
(docs/ray-compat.md lists every name). ``python -m ddlf_actors.compat.ray script.py``
runs an unmodified Ray script: ``import ray`` then resolves to this package.
"""

from __future__ import annotations

import os
import sys

import ddlf_actors as _ddlf
from ddlf_actors import runtime_context as _runtime_context
from ddlf_actors.api import ClusterInfo as _ClusterInfo
from ddlf_actors.ids import ActorID, JobID, NodeID, PlacementGroupID, TaskID, WorkerID
from ddlf_actors.runtime.client.generators import DynamicObjectRefGenerator, ObjectRefGenerator
from ddlf_actors.runtime.client.object_ref import ObjectRef
from ddlf_actors.runtime.wire.address import host_of as _host_of

from . import exceptions
from ._finder import ENV_VAR as _ENV_VAR
from ._finder import install as _install
from ._missing import NotProvidedError, missing, not_provided
from ._remote import remote

__all__ = [
    "init", "shutdown", "is_initialized", "remote", "get", "wait", "put", "kill", "cancel",
    "get_actor", "nodes", "cluster_resources", "available_resources", "method",
    "get_runtime_context", "get_gpu_ids", "ObjectRef", "ObjectRefGenerator",
    "DynamicObjectRefGenerator", "exceptions", "util", "actor", "runtime_env", "RayContext",
    "NotProvidedError", "JobID", "NodeID", "WorkerID", "TaskID", "ActorID", "PlacementGroupID",
]

# Ray's init arguments that only tune Ray's own processes: accepted and ignored.
_INIT_IGNORED = {
    "object_store_memory", "local_mode", "include_dashboard", "dashboard_host",
    "dashboard_port", "job_config", "configure_logging", "logging_level", "logging_format",
    "logging_config", "log_to_driver", "namespace", "storage", "labels",
    "enable_resource_isolation", "system_reserved_cpu", "system_reserved_memory",
    "cgroup_path", "_enable_object_reconstruction", "_system_config", "_temp_dir",
    "_node_ip_address", "_metrics_export_port", "_redis_password",
    "_plasma_directory", "_node_name", "_driver_object_store_memory", "_tracing_startup_hook",
    "_skip_env_hook", "_max_cpu_frequency",
}


class RayContext(dict):
    """What ``ray.init`` returns: a dict of ``address_info`` and a context manager.

    ``with ray.init(): ...`` shuts the cluster down at the end of the block, as in Ray.
    """

    def __init__(self, info: _ClusterInfo):
        super().__init__(address=info.address, node_ip_address=_host_of(info.address),
                         gcs_address=info.address)
        self.address_info = dict(self)
        # Ray's form: "host:port", without the scheme.
        url = info.dashboard_url
        self.dashboard_url = url.split("://", 1)[-1] if url else None
        self.python_version = ".".join(map(str, sys.version_info[:3]))
        self.ray_version = None
        self.ddlf = info

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutdown()

    def disconnect(self):
        shutdown()


def init(address: str | None = None, *, num_cpus: float | None = None,
         num_gpus: int | None = None, resources: dict | None = None,
         ignore_reinit_error: bool = False, runtime_env: dict | None = None,
         _memory: int | None = None, **kwargs) -> RayContext:
    """``ray.init`` on DDLF: an embedded local cluster, or ``"host:port"`` / ``"auto"``.

    ``num_gpus`` declares the embedded node's GPUs (default: found from
    ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi``). ``runtime_env`` (``env_vars``,
    ``working_dir``, ``py_modules``) is the job's, for any cluster; ``pip``, ``conda``
    and the like raise ``NotImplementedError``. ``include_dashboard=True`` starts the
    embedded cluster's dashboard at ``dashboard_port`` (default 8265) on 127.0.0.1 (it is
    off unless asked for: DDLF's needs aiohttp); ``dashboard_host``, logging and
    object-store arguments are accepted and ignored.
    """
    unknown = set(kwargs) - _INIT_IGNORED
    if unknown:
        raise TypeError(f"ray.init() got unexpected keyword argument(s) {sorted(unknown)}")
    if address in ("local", None):
        address = None
    elif isinstance(address, str) and address.startswith("ray://"):
        raise NotProvidedError(not_provided("client") + f" (address={address!r})")
    dashboard = bool(kwargs.get("include_dashboard")) and address is None
    info = _ddlf.init(address, num_cpus=num_cpus, num_gpus=num_gpus, memory=_memory,
                      resources=resources or None, runtime_env=runtime_env,
                      ignore_reinit_error=ignore_reinit_error, dashboard=dashboard,
                      dashboard_port=kwargs.get("dashboard_port") or 8265)
    return RayContext(info)


def shutdown(_exiting_interpreter: bool = False) -> None:
    _ddlf.shutdown()


def is_initialized() -> bool:
    return _ddlf.is_initialized()


def get(object_refs, *, timeout: float | None = None):
    """``ray.get``: a value, or a list of values; remote errors re-raise here."""
    return _ddlf.get(object_refs, timeout=timeout)


def wait(object_refs, *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True):
    """``ray.wait``: ``(ready, not_ready)``; ``fetch_local`` has no meaning in DDLF."""
    return _ddlf.wait(object_refs, num_returns=num_returns, timeout=timeout)


def put(value, *, _owner=None) -> ObjectRef:
    if _owner is not None:
        raise NotImplementedError("ray.put(_owner=...): a DDLF object is always owned by "
                                  "the process that put it")
    return _ddlf.put(value)


def kill(actor, *, no_restart: bool = True) -> None:
    _ddlf.kill(actor, no_restart=no_restart)


def cancel(ray_waitable, *, force: bool = False, recursive: bool = True) -> None:
    """``ray.cancel``: DDLF's ``cancel`` (same semantics; see ``ddlf_actors.cancel``)."""
    if not isinstance(ray_waitable, (ObjectRef, _ddlf.ObjectRefGenerator)):
        raise TypeError("ray.cancel() only supported for object refs. For actors, try "
                        f"ray.kill(). Got: {type(ray_waitable)}.")
    _ddlf.cancel(ray_waitable, force=force, recursive=recursive)


def get_actor(name: str, namespace: str | None = None):
    """The live actor named ``name``; DDLF has one namespace, so ``namespace`` is ignored."""
    return _ddlf.get_actor(name)


def nodes() -> list:
    """One dict per node, with Ray's keys (``NodeID``, ``Alive``, ``Resources``, ...) too."""
    out = []
    for n in _ddlf.nodes():
        host, _, port = n["address"].rpartition(":")
        out.append({**n, "NodeID": n["node_id"], "Alive": n["alive"],
                    "NodeManagerAddress": host, "NodeManagerHostname": host,
                    "NodeManagerPort": int(port) if port.isdigit() else None,
                    "Resources": n["resources"]})
    return out


def cluster_resources() -> dict:
    return _ddlf.cluster_resources()


def available_resources() -> dict:
    return _ddlf.available_resources()


def get_gpu_ids() -> list:
    """``ray.get_gpu_ids``: the GPU ids of the task or actor this runs in ([] in the driver)."""
    return _ddlf.get_gpu_ids()


def method(*args, **kwargs):
    """``@ray.method(...)``: ``num_returns=k`` works; other options raise or are ignored."""
    kwargs = dict(kwargs)
    for key in ("max_task_retries", "retry_exceptions", "enable_task_events"):
        kwargs.pop(key, None)
    return _ddlf.method(*args, **kwargs)


class RuntimeContext(_runtime_context.RuntimeContext):
    """``ray.get_runtime_context()``: DDLF's runtime context, plus Ray's spellings."""

    @property
    def gcs_address(self) -> str | None:
        """Ray's GCS is DDLF's head: its ``host:port``."""
        return self.head_address

    @property
    def runtime_env(self):
        """DDLF's ``runtime_env`` as Ray's ``RuntimeEnv``."""
        from .runtime_env import RuntimeEnv

        return RuntimeEnv(**super().runtime_env)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing(f"get_runtime_context().{name}")


_context = RuntimeContext()


def get_runtime_context() -> RuntimeContext:
    return _context


def __getattr__(name: str):
    # Submodules load on first use, as in Ray (ray.util, ray.actor).
    if name in ("util", "actor", "remote_function", "runtime_context", "_raylet", "dag",
                "_private", "runtime_env"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name == "cloudpickle":   # Ray vendors cloudpickle as ray.cloudpickle
        import cloudpickle

        return cloudpickle
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(name)


# A worker that unpickles code referring to this module imports it by its real name; in
# a program started by ``python -m ddlf_actors.compat.ray`` it must also answer to "ray".
if os.environ.get(_ENV_VAR) == "1":
    _install()
