"""``DAGInputData``: the arguments of one ``dag.execute(...)`` call, as the input nodes read them."""

from __future__ import annotations

__all__ = ["DAGInputData"]


class DAGInputData:
    """The input of ``dag.execute(*args, **kwargs)`` other than one positional value:
    ``data[i]`` is ``args[i]``, ``data["k"]`` is ``kwargs["k"]``."""

    def __init__(self, *args, **kwargs):
        self._args = list(args)
        self._kwargs = kwargs

    def __getitem__(self, key):
        if isinstance(key, int):
            if not -len(self._args) <= key < len(self._args):
                raise IndexError(f"the DAG input has {len(self._args)} positional "
                                 f"argument(s); inp[{key}] needs more in dag.execute(...)")
            return self._args[key]
        if isinstance(key, str):
            if key not in self._kwargs:
                raise KeyError(f"the DAG input has no keyword argument {key!r}; pass "
                               f"{key}=... to dag.execute(...)")
            return self._kwargs[key]
        raise TypeError(f"index a DAG input with an int or a str, not {type(key).__name__}")

    def __repr__(self):
        return f"DAGInputData(args={self._args!r}, kwargs={self._kwargs!r})"
