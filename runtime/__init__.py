"""What runs on hosts: transport, serialization, the head, node daemons and worker processes.

Nothing here imports from ``ddlf_actors`` (the public API) or ``apps``: imports point down only.
"""

__version__ = "0.1.0"
