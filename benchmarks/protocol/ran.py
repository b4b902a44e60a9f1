"""What a DDLF run ran, in words, from its result: the scheme (for ``train()``'s default,
the one it resolved to), its codec and its resolved round settings. Issue 30 asks every
table to say which scheme DDLF's defaults ran.

``TrainResult.settings`` (where DDLF records it: ``{"scheme", "compression", "options",
"auto": {..., "line"}}``) wins; a result without it names its scheme in ``.scheme`` and
its settings in ``.options`` and ``.config``.
"""

from __future__ import annotations

__all__ = ["scheme_ran", "compression_ran", "describe_settings", "describe_run"]


def scheme_ran(result) -> str:
    """The scheme the run was (``auto``'s choice, not ``auto``)."""
    settings = getattr(result, "settings", None) or {}
    return settings.get("scheme") or result.scheme


def compression_ran(result):
    """The codec the run sent with (None: arrays as they are)."""
    settings = getattr(result, "settings", None) or {}
    if "compression" in settings:
        return settings["compression"]
    config = getattr(result, "config", None)
    return getattr(config, "compression", None)


def describe_settings(cfg) -> str:
    """A rounds scheme's settings as the run resolved them (``result.options``), e.g.
    ``29 rounds/epoch, outer lr 0.7, Nesterov 0.9``; empty for a scheme without rounds."""
    rounds = getattr(cfg, "rounds_per_epoch", None)
    if rounds is None:
        return ""
    text = f"{rounds} round{'' if rounds == 1 else 's'}/epoch"
    lr = cfg.outer_lr if isinstance(cfg.outer_lr, (int, float)) else "schedule"
    if cfg.lr_scaling == "outer":
        text += f", outer lr {lr} x K (warm-up {cfg.warmup_rounds} rounds)"
    elif lr != 1.0:
        text += f", outer lr {lr}"
    if cfg.outer_momentum:
        text += f", {'Nesterov' if cfg.nesterov else 'momentum'} {cfg.outer_momentum:g}"
    if cfg.lr_scaling == "inner":
        text += f", trainers' lr x K (warm-up {cfg.warmup_rounds} rounds)"
    if cfg.lr_scaling == "none" and not cfg.outer_momentum and lr == 1.0:
        text += ", plain average"
    if getattr(cfg, "overlap", False):
        text += ", overlapped"
    if (getattr(cfg, "fragments", 1) or 1) > 1:
        text += f", {cfg.fragments} fragments"
    return text


def describe_run(result) -> str:
    """``allreduce: 29 rounds/epoch, outer lr 0.7, Nesterov 0.9, int8:ef``, and what
    ``auto`` chose and why when it did."""
    parts = [p for p in (describe_settings(result.options), compression_ran(result)) if p]
    text = f"{scheme_ran(result)}: {', '.join(str(p) for p in parts) or 'its defaults'}"
    auto = ((getattr(result, "settings", None) or {}).get("auto") or {}).get("line")
    return text + (f" ({auto})" if auto else "")
