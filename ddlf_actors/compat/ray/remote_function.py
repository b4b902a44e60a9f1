"""``ray.remote_function``: remote functions."""

from ddlf_actors.remote_function import RemoteFunction

from ._remote import RayRemoteFunction

__all__ = ["RemoteFunction", "RayRemoteFunction"]
