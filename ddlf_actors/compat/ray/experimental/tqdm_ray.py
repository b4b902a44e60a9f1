"""``ray.experimental.tqdm_ray``: DDLF's line-based progress bar
(:mod:`ddlf_actors.util.progress`)."""

from ddlf_actors.util.progress import tqdm

__all__ = ["tqdm"]
