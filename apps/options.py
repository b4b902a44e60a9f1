"""Options as dataclass fields that carry their own help and check.

A scheme declares its settings as a dataclass of :func:`option` fields in its own module
(``SyncOptions`` in ``schemes/sync.py`` ...); ``TrainConfig`` does the same for what every
scheme shares. From those fields come, in one place each:

- the checks: a bad value raises :class:`ConfigError` naming the option and the fix;
- ``ddlf-train run``'s flags (``cli.py`` builds them from the fields' metadata), so the
  flags and the keyword API cannot drift apart;
- the "does not apply to this scheme" refusal, naming the schemes that read a setting.

A scheme option left at None takes the scheme's default (:meth:`SchemeOptions.resolve`).
This is Ray's ``ray_option_utils`` table (``Option(type, check, default)``) written as
dataclass metadata, as Ray Train's config dataclasses are.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, ClassVar, TypeVar

__all__ = ["ConfigError", "option", "SchemeOptions", "int_at_least", "number_in", "rate",
           "boolean", "one_of", "schedule", "seconds", "describe_schedule", "filled"]


class ConfigError(ValueError):
    """An option of a run is wrong: ``option`` names it as the message does (``"workers"``,
    ``"min_workers=3"``), ``problem`` says what is wrong and how to fix it. A ``ValueError``,
    so callers that catch that keep working; the CLI names the flag from ``option``."""

    def __init__(self, option: str, problem: str):
        super().__init__(f"{option} {problem}")
        self.option = option
        self.problem = problem

    def __reduce__(self):
        return ConfigError, (self.option, self.problem)


Check = Callable[[str, Any], None]
T = TypeVar("T")


def filled(value: T | None, name: str) -> T:
    """A setting once the scheme's defaults are filled in (``SchemeOptions.resolve``,
    ``for_data``): never None there. ``RuntimeError`` if it is, which is a bug in the
    scheme (it read a setting it does not default)."""
    if value is None:
        raise RuntimeError(f"the setting {name} was read before the scheme's defaults were "
                           "filled in (a bug in DDLF, please report it)")
    return value


def option(default: Any = None, *, help: str, check: Check | None = None,
           cli: str | None = "auto", choices: tuple | None = None) -> Any:
    """A dataclass field for a setting: ``help`` (the flag's help and the docs' line),
    ``check(name, value)`` raising :class:`ConfigError`, ``cli``: how ``ddlf-train`` takes
    it (``"auto"`` from the default's type or the check; ``"int"``, ``"float"``,
    ``"flag"`` for store_true, ``"bool"`` for ``--x/--no-x``, ``"str"``; None: not on the
    command line), ``choices`` for a string setting."""
    return dataclasses.field(default=default, metadata={
        "help": help, "check": check, "cli": cli, "choices": choices})


# -- checks ------------------------------------------------------------------------------------
def int_at_least(low: int) -> Check:
    def check(name: str, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(name, f"must be an int >= {low}, got {v!r}")
    check.cli_type = "int"  # type: ignore[attr-defined]
    return check


def number_in(low: float, high: float, *, low_open: bool = False,
              high_open: bool = False) -> Check:
    def check(name: str, v: Any) -> None:
        ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and v == v
              and (v > low if low_open else v >= low) and (v < high if high_open else v <= high))
        if not ok:
            span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise ConfigError(name, f"must be a number in {span}, got {v!r}")
    check.cli_type = "float"  # type: ignore[attr-defined]
    return check


def rate(name: str, v: Any) -> None:
    """A learning rate: a number > 0, or a schedule (a Keras one, or any f(step) -> rate)."""
    if callable(v):
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise ConfigError(name, f"must be a number > 0 or a schedule f(step) -> rate, got {v!r}")


rate.cli_type = "float"  # type: ignore[attr-defined]


def boolean(name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise ConfigError(name, f"must be True or False, got {v!r}")


boolean.cli_type = "bool"  # type: ignore[attr-defined]


def one_of(*choices: str) -> Check:
    def check(name: str, v: Any) -> None:
        if v not in choices:
            raise ConfigError(name, f"must be one of {', '.join(map(repr, choices))}, got {v!r}")
    check.cli_type = "str"  # type: ignore[attr-defined]
    check.choices = choices  # type: ignore[attr-defined]
    return check


def schedule(name: str, v: Any) -> None:
    if not callable(v):
        raise ConfigError(name, "must be a Keras LearningRateSchedule or a function of the "
                          f"step returning a rate, got {v!r}")


def seconds(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise ConfigError(name, f"must be a number of seconds >= 0, got {v!r}")


seconds.cli_type = "float"  # type: ignore[attr-defined]


def describe_schedule(schedule_fn: Any) -> str:
    """A schedule as a checkpoint records it: its class and, for a Keras one, its config."""
    name = getattr(schedule_fn, "__qualname__", None) or type(schedule_fn).__qualname__
    get_config = getattr(schedule_fn, "get_config", None)
    if callable(get_config):
        try:
            return f"{name}({get_config()})"
        except Exception as e:   # a schedule whose config is not serialisable: its name will do
            logging.getLogger("ddlf_actors.train").debug("%s.get_config() failed: %s", name, e)
    return name


def check_fields(obj: Any) -> None:
    """Run every field's check on ``obj``'s values that are not None."""
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        value = getattr(obj, f.name)
        if check is not None and value is not None:
            check(f.name, value)


@dataclasses.dataclass
class SchemeOptions:
    """A scheme's settings. Subclasses add :func:`option` fields (None: the scheme's
    default), may override :meth:`defaults` (values that depend on the run, e.g. on K) and
    :meth:`validate` (settings that contradict each other)."""

    #: The scheme that reads these (set by each subclass; error messages name it).
    scheme: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self)

    def defaults(self, config: Any) -> dict:
        """The values of settings left at None, for a run of ``config``."""
        return {}

    def validate(self, config: Any) -> None:
        """Raise :class:`ConfigError` for settings that do not fit together (defaults
        filled in); called before any trainer starts."""

    def for_data(self, config: Any, infos: list) -> SchemeOptions:
        """Fill in the settings that depend on the data (the trainers' ``describe()``s):
        a copy, or ``self``."""
        return self

    def plan_rounds(self) -> int:
        """Pieces per trainer per epoch the plan of indices cuts (``plan.py``)."""
        return 1

    def resolve(self, config: Any) -> SchemeOptions:
        """A copy with the defaults filled in where left at None, checked."""
        fill = {k: v for k, v in self.defaults(config).items()
                if getattr(self, k) is None and v is not None}
        out = dataclasses.replace(self, **fill) if fill else dataclasses.replace(self)
        out.validate(config)
        return out

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_json(self) -> dict:
        """The settings as a checkpoint records them (schedules by name)."""
        return {f.name: (describe_schedule(v) if callable(v) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}
