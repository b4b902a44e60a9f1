"""The DDLF paper's master/worker API (its Table 3.5 and IWorker), built on actors.

    async def calculate(self, a, b, c):
        return a + b - c

    async def main():
        cluster = Cluster(workers_per_node=3)          # or Cluster(hosts, ports)
        await cluster.connect()
        print(await cluster.run_method(calculate, a=10, b=8, c=2))     # [16, 16, 16]
        await cluster.close()

    asyncio.run(main())

Each worker is a long-lived actor (one per node, or several per node if asked). A
method runs with the worker as ``self``, so attributes it sets persist on that worker
between calls: these are the paper's dynamic variables. Methods added with
``add_method`` persist until removed or shut down. ``Cluster.sync()`` gives the same
API without ``await`` for scripts that are not asyncio code.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import types

from ddlf_actors.runtime.errors import DDLFError
from ddlf_actors.runtime.session import read_config
from ddlf_actors.runtime.wire.address import host_of

from . import api
from .actor import ActorHandle

__all__ = ["Cluster", "WorkerProxy", "ClusterWorker", "read_config"]

log = logging.getLogger("ddlf.cluster")


class ClusterWorker:
    """The actor behind each worker. Internal attributes start with ``_ddlf_`` so that
    methods run on it may set their own attributes freely."""

    def __init__(self, index: int):
        self._ddlf_index = index
        self._ddlf_methods: set[str] = set()
        self._ddlf_globals: dict = {"self": self}
        self.index = index

    async def _ddlf_call(self, fn, kwargs: dict):
        result = fn(self, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def run_method(self, fn, kwargs: dict):
        return await self._ddlf_call(fn, kwargs)

    async def add_method(self, fn, name: str | None = None) -> str:
        name = name or fn.__name__
        setattr(self, name, types.MethodType(fn, self))
        self._ddlf_methods.add(name)
        return name

    async def remove_method(self, name: str) -> bool:
        if name not in self._ddlf_methods:
            return False
        self._ddlf_methods.discard(name)
        delattr(self, name)
        return True

    async def run(self, name: str, kwargs: dict):
        if name not in self._ddlf_methods:
            raise AttributeError(f"worker {self._ddlf_index} has no method {name!r}: add it first "
                                 "with cluster.add_method(fn)")
        result = getattr(self, name)(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def run_code(self, code: str) -> None:
        exec(compile(code, f"<run_code on worker {self._ddlf_index}>", "exec"), self._ddlf_globals)

    async def get_variable(self, name: str):
        return getattr(self, name)

    async def info(self) -> dict:
        return {"index": self._ddlf_index, "pid": os.getpid(), "methods": sorted(self._ddlf_methods)}


_ClusterWorkerActor = api.remote(num_cpus=0, max_concurrency=1)(ClusterWorker)


class WorkerProxy:
    """The master's side of one worker: the paper's ``ProxyWorker`` (IWorker methods)."""

    def __init__(self, handle: ActorHandle, index: int, node_id: str | None):
        self.handle = handle
        self.index = index
        self.node_id = node_id

    async def connect(self) -> None:
        await self.handle.info.remote()

    async def close(self) -> None:
        pass

    async def add_method(self, method_code, method_name: str | None = None) -> str:
        return await self.handle.add_method.remote(method_code, method_name)

    async def remove_method(self, method_name) -> bool:
        return await self.handle.remove_method.remote(_name_of(method_name))

    async def run(self, method_name, **kwargs):
        return await self.handle.run.remote(_name_of(method_name), kwargs)

    async def run_code(self, code: str) -> None:
        return await self.handle.run_code.remote(code)

    async def run_method(self, method_code, method_name: str | None = None, **kwargs):
        return await self.handle.run_method.remote(method_code, kwargs)

    async def shutdown(self) -> None:
        api.kill(self.handle)

    def __repr__(self):
        return f"WorkerProxy(index={self.index}, node={self.node_id})"


def _name_of(method) -> str:
    return method if isinstance(method, str) else method.__name__


class Cluster:
    """A set of long-lived workers, one per node (or ``workers_per_node`` per node).

    ``Cluster()`` uses the current DDLF session, starting an embedded one if needed;
    ``Cluster(address="host:port")`` joins a running head; ``Cluster(hosts, ports)``
    joins the first reachable ``host:port`` and keeps workers on those hosts only.
    ``workers_per_node="cpu"`` starts one worker per CPU.
    """

    def __init__(self, hosts=None, ports=None, *, address: str | None = None,
                 workers_per_node: int | str = 1, token: str | None = None):
        if hosts is not None and ports is not None and len(hosts) != len(ports):
            raise ValueError("hosts and ports must have the same length")
        self.hosts = list(hosts) if hosts is not None else None
        self.ports = list(ports) if ports is not None else None
        self.address = address
        self.token = token
        self.workers_per_node = workers_per_node
        self.workers: list[WorkerProxy] = []
        self._started_session = False

    # -- connecting --------------------------------------------------------------------------
    async def connect(self) -> Cluster:
        await asyncio.get_running_loop().run_in_executor(None, self._connect_blocking)
        await asyncio.gather(*(w.connect() for w in self.workers))
        return self

    def _connect_blocking(self) -> None:
        if not api.is_initialized():
            self._init_session()
            self._started_session = True
        nodes = [n for n in api.nodes() if n["alive"]]
        if self.hosts is not None:
            wanted = set(self.hosts)
            nodes = [n for n in nodes if host_of(n["address"]) in wanted] or nodes
        index = 0
        for n in nodes:
            per = self.workers_per_node
            count = int(n["resources"].get("CPU", 1)) if per == "cpu" else int(per)
            for _ in range(max(1, count)):
                h = _ClusterWorkerActor.options(node_id=n["node_id"]).remote(index)
                self.workers.append(WorkerProxy(h, index, n["node_id"]))
                index += 1
        if not self.workers:
            raise DDLFError("the cluster has no alive nodes to start workers on")

    def _init_session(self) -> None:
        if self.address is not None:
            api.init(self.address, token=self.token)
            return
        if self.hosts:
            errors = []
            for host, port in zip(self.hosts, self.ports or [None] * len(self.hosts)):
                addr = f"{host}:{port}" if port else host
                try:
                    api.init(addr, token=self.token)
                    return
                except Exception as e:  # try the next host in the list
                    errors.append(f"{addr}: {e}")
            raise DDLFError("could not reach a DDLF head at any of the given hosts:\n  "
                            + "\n  ".join(errors))
        api.init()

    async def close(self) -> None:
        """Drop the workers (and stop the session if this cluster started it)."""
        await self.shutdown()
        if self._started_session:
            await asyncio.get_running_loop().run_in_executor(None, api.shutdown)
            self._started_session = False

    async def shutdown(self) -> None:
        """Shut down every worker of this cluster."""
        for w in self.workers:
            try:
                api.kill(w.handle)
            except Exception as e:
                # Already dead, or the session is gone: either way it no longer runs,
                # which is what shutdown asks for.
                log.debug("killing worker actor %r: %r", w.handle, e)
        self.workers = []

    # -- running things ----------------------------------------------------------------------
    def _require(self) -> list[WorkerProxy]:
        if not self.workers:
            raise DDLFError("the cluster is not connected: await cluster.connect() first")
        return self.workers

    async def run_method(self, method, *kwargs_list: dict, **kwargs) -> list:
        """Run ``method`` on every worker with ``kwargs``; or, given dicts, worker j runs with
        the j-th dict (fewer dicts than workers: only that many workers run)."""
        workers = self._require()
        if kwargs_list:
            if kwargs:
                raise TypeError("give either keyword arguments or per-worker dicts, not both")
            if len(kwargs_list) > len(workers):
                raise ValueError(f"{len(kwargs_list)} argument dicts for {len(workers)} workers")
            pairs = list(zip(workers, kwargs_list))
        else:
            pairs = [(w, kwargs) for w in workers]
        refs = [w.handle.run_method.remote(method, dict(kw)) for w, kw in pairs]
        return list(await asyncio.gather(*refs))

    async def run_at(self, worker, method, **kwargs):
        """Run ``method`` (a function, or the name of an added method) on one worker."""
        w = self._worker(worker)
        if isinstance(method, str):
            return await w.handle.run.remote(method, kwargs)
        return await w.handle.run_method.remote(method, kwargs)

    async def add_method(self, method, name: str | None = None) -> str:
        workers = self._require()
        names = await asyncio.gather(*(w.handle.add_method.remote(method, name) for w in workers))
        return names[0]

    async def remove_method(self, method) -> None:
        name = _name_of(method)
        await asyncio.gather(*(w.handle.remove_method.remote(name) for w in self._require()))

    async def run(self, method, **kwargs) -> list:
        name = _name_of(method)
        return list(await asyncio.gather(*(w.handle.run.remote(name, kwargs) for w in self._require())))

    async def run_code(self, code: str) -> None:
        await asyncio.gather(*(w.handle.run_code.remote(code) for w in self._require()))

    def _worker(self, worker) -> WorkerProxy:
        workers = self._require()
        if isinstance(worker, WorkerProxy):
            return worker
        if isinstance(worker, ActorHandle):
            for w in workers:
                if w.handle == worker:
                    return w
            raise ValueError(f"{worker!r} is not a worker of this cluster")
        if isinstance(worker, int) and -len(workers) <= worker < len(workers):
            return workers[worker]
        raise IndexError(f"worker {worker!r} out of range: the cluster has {len(workers)} workers")

    def __len__(self):
        return len(self.workers)

    # -- without asyncio ---------------------------------------------------------------------
    def sync(self) -> SyncCluster:
        """The same API, blocking: ``Cluster().sync().connect().run_method(fn, a=1)``."""
        return SyncCluster(self)


class SyncCluster:
    """Blocking wrappers around :class:`Cluster` for code that is not asyncio code."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def __getattr__(self, name):
        attr = getattr(self.cluster, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args, **kwargs):
            result = asyncio.run(attr(*args, **kwargs))
            return self if result is self.cluster else result

        return call
