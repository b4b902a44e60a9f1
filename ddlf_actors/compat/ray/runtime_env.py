"""``ray.runtime_env``: ``RuntimeEnv``, a dict of the fields DDLF supports.

DDLF runs ``env_vars``, ``working_dir``, ``py_modules`` and ``excludes``; any other field
(``pip``, ``conda``, ``container``, ``uv`` ...) is refused by name where the env is used
(``ray.init``, ``@ray.remote``, ``.options``), as a plain dict would be.
"""

from __future__ import annotations

__all__ = ["RuntimeEnv"]


class RuntimeEnv(dict):
    """``RuntimeEnv(env_vars=..., working_dir=..., py_modules=...)``: Ray's typed runtime env."""

    def __init__(self, *, py_modules=None, working_dir=None, pip=None, conda=None,
                 container=None, env_vars=None, worker_process_setup_hook=None,
                 nsight=None, config=None, _validate: bool = True, **kwargs):
        super().__init__()
        given = dict(py_modules=py_modules, working_dir=working_dir, pip=pip, conda=conda,
                     container=container, env_vars=env_vars, nsight=nsight, config=config,
                     worker_process_setup_hook=worker_process_setup_hook, **kwargs)
        self.update({k: v for k, v in given.items() if v is not None})
