"""What a cached dataset was built from, as digests: files by their stat, code by its source.

``load_shared`` names a cache entry ``<family>-<stamp>``. The *family* says where the
data comes from and stays put when the data changes (a dataset's resolved file paths, a
callable's pickled reference and arguments); the *stamp* says what that source holds
now (the files' sizes and times, the code the callable runs). This module computes the
parts; ``cache`` puts them together.

All of it is cheap: ``stat`` calls and reading a few source files, never the data.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import os
import sys
import types
from typing import Callable, Iterable

__all__ = ["digest", "files_stamp", "pickled_digest", "code_stamp", "declared_files"]

# Module-level values a function reads that are plain data, so a change to them in a
# running process shows in its code stamp (see code_stamp).
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def digest(*parts) -> str:
    """sha256 hex of ``parts`` (each as ``str``, or ``bytes`` as is), unambiguously joined."""
    h = hashlib.sha256()
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return h.hexdigest()


def files_stamp(paths: Iterable[str]) -> str:
    """A digest that changes when any of ``paths`` is rewritten or replaced.

    Made of each file's absolute path, size, mtime, ctime and inode number. The ctime
    and inode are there because a copying tool (``cp -p``, ``rsync -t``, ``tar x``) puts
    the old mtime on new bytes, while the ctime moves on every write and a file
    renamed into place is another inode. Not told apart: a file rewritten in place
    with the same size twice within one tick of the file system's clock (a few ms).
    Raises ``OSError`` (``FileNotFoundError``) for a file that is gone.
    """
    parts = []
    for path in paths:
        st = os.stat(path)
        parts += [os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return digest(*parts)


def pickled_digest(fn: Callable) -> str:
    """sha256 hex of ``cloudpickle.dumps(fn)``: equal in every process for the same function.

    For a function defined in an importable module, cloudpickle writes only its module
    and qualified name (the body is imported on the other side), so this names the
    function and its arguments (a ``functools.partial``'s, a callable object's state),
    not what it computes: ``code_stamp`` covers that.
    """
    import cloudpickle  # a dependency of ddlf_actors; imported here to keep import light

    return hashlib.sha256(cloudpickle.dumps(fn)).hexdigest()


def code_stamp(fn: Callable) -> str:
    """A digest of the code ``fn`` runs that its pickle names only by reference.

    Two parts:

    - a sha256 of the *source* of each module defining a function or class that ``fn``
      reaches by name (``fn`` itself, the class of a callable object, the function in a
      ``functools.partial``, module-level helpers it calls from its own module). A hash
      of the source, not the file's path, size and mtime: the driver and the trainers
      import the same module from different paths (a trainer's copy of a
      ``working_dir`` is unpacked with fixed 1980 times, a checkout elsewhere on each
      host), and the same source must give the same key, while any edit must give
      another. Reading a few source files costs far less than building an entry.
    - the code these functions run *in this process*: their bytecode and constants, and
      the plain values (numbers, strings) they read from module globals. A process that
      imported the module before its file was edited (a notebook) runs the old code:
      its data must not be filed under the new source's stamp, where a fresh run would
      find it. Bytecode is the same on every host, since DDLF requires one Python
      major.minor across a cluster.

    Not covered: functions of *other* modules that ``fn`` calls (a library's reader),
    and the data files ``fn`` reads, unless it names them (``declared_files``).
    """
    walk = _CodeWalk()
    walk.visit(fn)
    parts = []
    for name in sorted(walk.modules):
        parts += [name, _source_digest(sys.modules.get(name))]
    return digest(*parts, *walk.code)


def declared_files(fn: Callable, data_dir: str | None = None) -> list:
    """The files a dataset callable says it reads: ``fn.source_files()`` (given
    ``data_dir=`` when one is set, as ``load`` calls a registered loader), or ``[]``
    when it has no such method."""
    hook = getattr(fn, "source_files", None)
    if hook is None or isinstance(fn, type) or not callable(hook):
        return []
    paths = hook() if data_dir is None else hook(data_dir=data_dir)
    return [os.fspath(p) for p in paths]


class _CodeWalk:
    """Collects the modules and in-memory code behind a callable (see ``code_stamp``)."""

    def __init__(self):
        self.modules: set = set()
        self.code: list = []
        self._seen: set = set()

    def visit(self, obj) -> None:
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if isinstance(obj, functools.partial):
            self.visit(obj.func)
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__func__)
        elif isinstance(obj, types.FunctionType):
            self._function(obj)
        elif isinstance(obj, type):
            for cls in obj.__mro__[:-1]:  # the class and its bases, not object
                if _by_reference(cls):
                    self.modules.add(cls.__module__)
                call = cls.__dict__.get("__call__")
                if isinstance(call, types.FunctionType):
                    self.visit(call)
        elif not isinstance(obj, (types.BuiltinFunctionType, types.ModuleType)):
            self.visit(type(obj))  # a callable object: its class holds __call__

    def _function(self, fn: types.FunctionType) -> None:
        if _by_reference(fn):
            self.modules.add(fn.__module__)
        self.code.append(digest(fn.__qualname__, *_code_parts(fn.__code__)))
        # Follow the globals it reads: plain values go into the stamp; functions of the
        # same module are walked too (their source is in the same file, but a stale
        # process runs their old code).
        for name in sorted(_global_names(fn.__code__)):
            if name not in fn.__globals__:
                continue  # a builtin (len, range): the cluster's Python fixes those
            value = fn.__globals__[name]
            if isinstance(value, _PLAIN) or (isinstance(value, (tuple, frozenset))
                                             and all(isinstance(v, _PLAIN) for v in value)):
                self.code.append(digest(fn.__module__, name, _stable(value)))
            elif isinstance(value, types.FunctionType) and value.__module__ == fn.__module__:
                self.visit(value)


def _by_reference(obj) -> bool:
    """True when cloudpickle pickles ``obj`` (a function or class) by module and name."""
    import cloudpickle

    module_name = getattr(obj, "__module__", None)
    if not module_name or module_name == "__main__":
        return False
    by_value = cloudpickle.list_registry_pickle_by_value()
    if any(module_name == m or module_name.startswith(m + ".") for m in by_value):
        return False
    target = sys.modules.get(module_name)
    for part in obj.__qualname__.split("."):  # "<locals>" and "<lambda>" find nothing
        target = getattr(target, part, None)
    return target is obj


def _source_digest(module) -> str:
    path = getattr(module, "__file__", None)
    if not path:
        return ""  # built into the interpreter: its version is the cluster's Python
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""  # imported from a zip or gone: the in-memory code still counts


def _code_parts(code: types.CodeType):
    """Bytecode, names and constants of ``code`` and its nested code (no file or line)."""
    yield code.co_code
    yield " ".join(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_parts(const)
        else:
            yield _stable(const)


_GLOBAL_OPS = {"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"}


def _global_names(code: types.CodeType) -> set:
    """The global names ``code`` (and code nested in it) reads or writes. Not
    ``co_names``, which also holds attribute names: a function cloudpickle ships by value
    arrives with only its real globals, so an attribute that shares a global's name
    would make the driver's stamp differ from the trainer's."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _stable(value) -> str:
    """``repr`` that is the same in every process: a frozenset of strings iterates in an
    order that depends on the process's hash seed, so its members are sorted."""
    if isinstance(value, (frozenset, set)):
        return "{" + ",".join(sorted(_stable(v) for v in value)) + "}"
    if isinstance(value, tuple):
        return "(" + ",".join(_stable(v) for v in value) + ")"
    return repr(value)
