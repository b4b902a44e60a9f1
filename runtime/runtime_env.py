"""Runtime environments: ``env_vars``, ``working_dir`` and ``py_modules`` for tasks and actors.

A runtime env goes through three places:

* **The caller** (driver, or a worker that submits work) checks it at the call
  (:func:`validate`: unknown fields and bad paths fail there, not in a worker), packs each
  directory into a zip named by the hash of its bytes (:func:`pack`), uploads each zip
  to the head once (:func:`for_call`) and merges the result over its parent's env as Ray
  does (:func:`merge`): ``env_vars`` key by key, every other field replaced. What goes on
  the wire names packages by id, never by path: a remote node does not share the
  caller's file system.
* **The node** fetches a package it lacks from the head, once per node, and unpacks it
  into its session folder (:class:`PackageCache`).
* **The worker** sets the variables, changes into the working_dir and puts it and the
  py_modules at the front of ``sys.path`` (:func:`apply`) before any user code runs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import types
import zipfile

from . import context

__all__ = ["SUPPORTED_FIELDS", "MAX_PACKAGE_BYTES", "RuntimeEnvSpec", "validate", "merge",
           "pack", "packed", "for_call", "upload", "env_key", "check_package", "PackageCache",
           "local_setup", "packages", "apply", "front", "unpack"]

SUPPORTED_FIELDS = ("env_vars", "working_dir", "py_modules", "excludes")

# Ray fields DDLF has no equivalent for: refused by name, never silently dropped, since a
# task would otherwise run without the packages or image it asked for.
_UNSUPPORTED = ("pip", "conda", "uv", "container", "image_uri", "java_jars", "nsight",
                "mpi", "rocprof_sys", "config", "worker_process_setup_hook", "_inject_current_ray")


def _max_bytes() -> int:
    raw = os.environ.get("DDLF_RUNTIME_ENV_MAX_MB")
    try:
        return int(float(raw) * (1 << 20)) if raw else 100 << 20
    except ValueError:
        raise ValueError(f"DDLF_RUNTIME_ENV_MAX_MB={raw!r} is not a number") from None


# Every package is held by the head for the session and sent to each node that needs it.
MAX_PACKAGE_BYTES = _max_bytes()

# Never worth shipping: version-control data and caches that Python rebuilds.
_DEFAULT_EXCLUDES = (".git", ".hg", ".svn", "__pycache__", "*.pyc", ".DS_Store",
                     ".pytest_cache", ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)   # zip timestamps: equal contents give equal bytes


class RuntimeEnvSpec(dict):
    """A checked runtime env (absolute paths). It remembers its packed wire form, so
    ``f.remote()`` does not pack a directory again on every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._wire = None       # (wire dict, {pkg_id: (kind, path, excludes)})


# -- the caller: check, pack, merge ---------------------------------------------------------
def validate(runtime_env, what: str = "runtime_env") -> RuntimeEnvSpec | None:
    """Check ``runtime_env`` and return it with absolute paths, or None if it is empty.

    Raises ``NotImplementedError`` for a Ray field DDLF lacks (``pip``, ``conda`` ...),
    ``ValueError`` for an unknown field or a path that does not exist, ``TypeError`` for
    values of the wrong type.
    """
    if runtime_env is None:
        return None
    if isinstance(runtime_env, RuntimeEnvSpec):
        return runtime_env
    if not isinstance(runtime_env, dict):
        raise TypeError(f"{what} must be a dict, got {type(runtime_env).__name__}")
    for key in runtime_env:
        if key in _UNSUPPORTED:
            raise NotImplementedError(
                f"{what}[{key!r}] is not supported by DDLF: it cannot install packages or "
                f"start containers for a task. Install what the code needs on every host "
                f"(or ship your own code with working_dir/py_modules). Supported fields: "
                f"{', '.join(SUPPORTED_FIELDS)}")
        if key not in SUPPORTED_FIELDS:
            raise ValueError(f"unknown {what} field {key!r}; supported fields are "
                             f"{', '.join(SUPPORTED_FIELDS)}")
    out = RuntimeEnvSpec()
    env_vars = runtime_env.get("env_vars")
    if env_vars:
        if not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            raise TypeError(f"{what}['env_vars'] must be a dict of str -> str (as in Ray; "
                            f"write numbers as strings), got {env_vars!r}")
        out["env_vars"] = dict(env_vars)
    excludes = runtime_env.get("excludes")
    if excludes:
        if not isinstance(excludes, (list, tuple)) or not all(isinstance(p, str) for p in excludes):
            raise TypeError(f"{what}['excludes'] must be a list of glob patterns, got {excludes!r}")
        out["excludes"] = list(excludes)
    wd = runtime_env.get("working_dir")
    if wd is not None:
        out["working_dir"] = _local_dir(wd, f"{what}['working_dir']")
    mods = runtime_env.get("py_modules")
    if mods:
        if not isinstance(mods, (list, tuple)):
            raise TypeError(f"{what}['py_modules'] must be a list of paths or imported modules, "
                            f"got {type(mods).__name__}")
        out["py_modules"] = [_module_path(m, f"{what}['py_modules']") for m in mods]
    return out or None


def _is_uri(path: str) -> bool:
    return "://" in path


def _local_dir(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path to a local directory, got {path!r}")
    path = os.fspath(path)
    if _is_uri(path):
        raise NotImplementedError(f"{what}={path!r}: DDLF ships local directories only, not "
                                  "remote URIs; download it and give its local path")
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full):
        why = "is not a directory" if os.path.exists(full) else "does not exist"
        raise ValueError(f"{what}={path!r}: {full} {why}; give an existing local directory")
    return full


def _module_path(mod, what: str) -> str:
    if isinstance(mod, types.ModuleType):
        paths = list(getattr(mod, "__path__", []) or [])
        if len(paths) > 1:
            raise ValueError(f"{what}: module {mod.__name__} is a namespace package spread over "
                             f"{paths}; give one of its directories instead")
        path = paths[0] if paths else getattr(mod, "__file__", None)
        if not path:
            raise ValueError(f"{what}: module {mod.__name__} has no file to ship (built in?)")
        return path if not paths else _local_dir(path, what)
    if not isinstance(mod, (str, os.PathLike)):
        raise TypeError(f"{what} entries must be paths or imported modules, got {mod!r}")
    path = os.fspath(mod)
    if _is_uri(path):
        raise NotImplementedError(f"{what} entry {path!r}: DDLF ships local paths only, not "
                                  "remote URIs")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        return full
    if os.path.isfile(full) and full.endswith(".py"):
        return full
    why = "is neither a directory nor a .py file" if os.path.exists(full) else "does not exist"
    raise ValueError(f"{what} entry {path!r}: {full} {why}; give a package directory, a .py "
                     "file or an imported module")


def merge(parent: dict | None, child: dict | None) -> dict | None:
    """Ray's rule for a task's env over its parent's (the job's, or the calling task's):
    ``env_vars`` merge key by key with the child's winning; any other field the child
    gives replaces the parent's."""
    if not child:
        return parent
    if not parent:
        return child
    out = {k: v for k, v in parent.items() if k != "key"}
    for k, v in child.items():
        if k == "key":
            continue
        out[k] = {**parent.get("env_vars", {}), **v} if k == "env_vars" else v
    out["key"] = env_key(out)
    return out


def env_key(wire: dict | None) -> str:
    """A short name for a wire env: workers started for one never run work of another."""
    if not wire:
        return ""
    body = json.dumps({k: v for k, v in wire.items() if k != "key"}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _listing(root: str, excludes: tuple, arc_prefix: str) -> list:
    """Files under ``root`` to ship: (path, name in the zip, size, mode, mtime), sorted."""
    patterns = _DEFAULT_EXCLUDES + excludes

    def excluded(rel: str) -> bool:
        base = rel.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(base, p)
                   or fnmatch.fnmatch(rel + "/", p) for p in patterns)

    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not excluded(rel_dir + d))
        for name in sorted(filenames):
            rel = rel_dir + name
            if excluded(rel):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue   # a dangling symlink: nothing to ship
            if stat.S_ISREG(st.st_mode):
                out.append((path, arc_prefix + rel, st.st_size, st.st_mode, st.st_mtime_ns))
    return out


# path -> (fingerprint, pkg_id, zip bytes); a few entries, so repeated calls do not re-zip.
_pack_cache: dict = {}
_PACK_CACHE_ENTRIES = 8


def pack(path: str, excludes=(), what: str = "working_dir") -> tuple[str, bytes]:
    """Zip a directory (or one .py file) into ``(package id, bytes)``.

    A ``working_dir`` is zipped by its contents; a ``py_modules`` directory or file keeps
    its own name in the zip, so its parent folder goes on ``sys.path``. The id is the
    hash of the zip, whose bytes depend only on names, contents and file modes.
    Raises ``ValueError`` when the files add up to more than ``MAX_PACKAGE_BYTES``.
    """
    excludes = tuple(excludes or ())
    if os.path.isfile(path):
        st = os.stat(path)
        files = [(path, os.path.basename(path), st.st_size, st.st_mode, st.st_mtime_ns)]
    else:
        prefix = "" if what == "working_dir" else os.path.basename(path.rstrip(os.sep)) + "/"
        files = _listing(path, excludes, prefix)
    total = sum(f[2] for f in files)
    limit = MAX_PACKAGE_BYTES
    if total > limit:
        biggest = sorted(files, key=lambda f: -f[2])[:3]
        names = ", ".join(f"{f[1]} ({f[2] / (1 << 20):.1f} MiB)" for f in biggest)
        raise ValueError(
            f"runtime_env {what} {path} holds {total / (1 << 20):.1f} MiB of files, more than "
            f"the {limit / (1 << 20):.0f} MiB DDLF ships to each node (largest: {names}). "
            f"Leave big files out with runtime_env={{'excludes': [...]}} (glob patterns), put "
            "data on every host or on shared storage, or raise DDLF_RUNTIME_ENV_MAX_MB")
    key = (path, what == "working_dir", excludes)
    fingerprint = tuple((f[1], f[2], f[3], f[4]) for f in files)
    hit = _pack_cache.get(key)
    if hit is not None and hit[0] == fingerprint:
        return hit[1], hit[2]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for fpath, arcname, _size, mode, _mtime in files:
            info = zipfile.ZipInfo(arcname, date_time=_FIXED_TIME)
            info.external_attr = (stat.S_IFREG | (mode & 0o777)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(fpath, "rb") as f:
                zf.writestr(info, f.read())
    data = buf.getvalue()
    pkg_id = "pkg-" + hashlib.sha256(data).hexdigest()[:40]
    if len(_pack_cache) >= _PACK_CACHE_ENTRIES:
        _pack_cache.pop(next(iter(_pack_cache)))
    _pack_cache[key] = (fingerprint, pkg_id, data)
    return pkg_id, data


def packed(spec: RuntimeEnvSpec) -> tuple[dict, dict]:
    """The wire form of a checked env (packages by id) and where each package comes from.

    Packs its directories on first use; raises ``ValueError`` for one over the size cap.
    """
    if spec._wire is None:
        wire: dict = {}
        sources: dict = {}
        if spec.get("env_vars"):
            wire["env_vars"] = dict(spec["env_vars"])
        excludes = tuple(spec.get("excludes") or ())
        if spec.get("working_dir"):
            pkg_id, _ = pack(spec["working_dir"], excludes, "working_dir")
            wire["working_dir"] = pkg_id
            sources[pkg_id] = (spec["working_dir"], excludes, "working_dir")
        if spec.get("py_modules"):
            ids = []
            for path in spec["py_modules"]:
                pkg_id, _ = pack(path, excludes, "py_modules")
                ids.append(pkg_id)
                sources[pkg_id] = (path, excludes, "py_modules")
            wire["py_modules"] = ids
        wire["key"] = env_key(wire)
        spec._wire = (wire, sources)
    return spec._wire


def for_call(core, runtime_env) -> dict | None:
    """The wire env a call made through ``core`` runs in: its own ``runtime_env`` merged
    over its parent's (the worker's own env inside a task or actor, else the job's set at
    ``init``), with every package it names uploaded to the head."""
    ctx = context.current
    parent = ctx.runtime_env if ctx is not None else core.runtime_env
    spec = validate(runtime_env) if runtime_env else None
    if spec is None:   # none given, or nothing in it (e.g. {"env_vars": {}})
        return parent
    wire, sources = packed(spec)
    upload(core, sources)
    return merge(parent, wire)


def upload(core, sources: dict) -> None:
    """Give the head each package it lacks (once per package and core)."""
    done = core.__dict__.setdefault("_uploaded_packages", set())
    for pkg_id, (path, excludes, what) in sources.items():
        if pkg_id in done:
            continue
        if not core.head_call("has_package", pkg_id):
            new_id, data = pack(path, excludes, what)
            if new_id != pkg_id:
                raise ValueError(f"runtime_env {what} {path} changed after it was checked; "
                                 "call .options(runtime_env=...) again to ship the new files")
            core.head_call("put_package", pkg_id, data, timeout=300)
        done.add(pkg_id)


def check_package(pkg_id: str, data: bytes) -> None:
    """Raise ``ValueError`` unless ``data`` is the package named ``pkg_id``."""
    if not isinstance(data, (bytes, bytearray)) or "pkg-" + hashlib.sha256(data).hexdigest()[:40] != pkg_id:
        raise ValueError(f"package {pkg_id}: the bytes do not match its hash")


# -- the node: fetch once, unpack once -----------------------------------------------------
class PackageCache:
    """Packages unpacked on this node, under ``root`` (the node's session folder).

    ``fetch(pkg_id)`` is a coroutine that returns the package's bytes (from the head).
    Concurrent requests for one package share a single fetch and unpack.
    """

    def __init__(self, root: str, fetch):
        self.root = root
        self._fetch = fetch
        self._inflight: dict = {}

    def path(self, pkg_id: str) -> str:
        return os.path.join(self.root, pkg_id)

    async def ensure(self, pkg_id: str) -> str:
        import asyncio

        if not isinstance(pkg_id, str) or not pkg_id.startswith("pkg-") or "/" in pkg_id:
            raise ValueError(f"bad package id {pkg_id!r}")
        dest = self.path(pkg_id)
        if os.path.isdir(dest):
            return dest
        fut = self._inflight.get(pkg_id)
        if fut is None:
            fut = self._inflight[pkg_id] = asyncio.ensure_future(self._get(pkg_id, dest))
            fut.add_done_callback(lambda _f: self._inflight.pop(pkg_id, None))
        return await asyncio.shield(fut)

    async def _get(self, pkg_id: str, dest: str) -> str:
        import asyncio

        data = await self._fetch(pkg_id)
        if data is None:
            raise ValueError(f"the head does not hold package {pkg_id} (the head restarted, or "
                             "its uploader failed part-way); submit the work again")
        check_package(pkg_id, data)
        await asyncio.get_running_loop().run_in_executor(None, unpack, data, dest)
        return dest

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def unpack(data: bytes, dest: str) -> None:
    """Unpack the package ``data`` into the new folder ``dest`` (all at once: a reader
    never sees half of it)."""
    # Into a temporary folder, then renamed.
    parent = os.path.dirname(dest)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = f"{dest}.tmp-{os.getpid()}-{id(data)}"
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            target = zf.extract(info, tmp)   # extract() drops absolute and ".." parts
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(target, mode)
    try:
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)   # another unpack won the race
        if not os.path.isdir(dest):
            raise


def local_setup(cache: PackageCache, wire: dict | None) -> dict:
    """What a worker applies for ``wire`` on this node (packages must be unpacked)."""
    if not wire:
        return {}
    setup: dict = {"runtime_env": wire, "env_vars": dict(wire.get("env_vars") or {})}
    paths = []
    if wire.get("working_dir"):
        setup["cwd"] = cache.path(wire["working_dir"])
        paths.append(setup["cwd"])
    paths.extend(cache.path(p) for p in wire.get("py_modules") or ())
    setup["sys_path"] = paths
    return setup


def packages(wire: dict | None) -> list:
    if not wire:
        return []
    return ([wire["working_dir"]] if wire.get("working_dir") else []) + list(wire.get("py_modules") or ())


# -- the worker ---------------------------------------------------------------------------------
_pinned = 0   # sys.path entries at the front that belong to the runtime env


def apply(setup: dict) -> None:
    """Set the env's variables, cwd and import path in this process (before user code)."""
    global _pinned
    os.environ.update(setup.get("env_vars") or {})
    if setup.get("cwd"):
        os.chdir(setup["cwd"])
    paths = [p for p in setup.get("sys_path") or () if p not in sys.path]
    if paths:
        sys.path[:0] = paths
        _pinned += len(paths)


def front() -> int:
    """How many ``sys.path`` entries the runtime env holds at the front: callers' paths go
    after them, so the working_dir stays ``sys.path[0]``."""
    return _pinned
