"""The head: the cluster's directory of nodes, actors, names, leases and placement groups.

Drivers, nodes and workers all connect here first. The head places actors and task
leases on nodes by free resources, restarts actors that may be restarted, answers
"where is actor X now", and fans worker logs out to the drivers that own them. Calls
to actors never pass through it. ``python -m ddlf_actors.runtime.head`` runs one.

As in Ray's GCS, one manager holds each concern's state, with no I/O (so each is tested
without processes), and a thin shell wires them to the network:

===================  ========================  ==============================================
module               holds                     what for
===================  ========================  ==============================================
nodes.py             ``NodeTable``             nodes, their resources, liveness (heartbeats)
actors.py            ``ActorDirectory``        actor records, names, restarts, dead records
leases.py            ``LeaseManager``          workers lent for tasks, lent-while-blocked
placement_groups.py  ``PlacementGroupManager``  groups, bundle reservations, their placement
scheduler.py         ``Scheduler``             which node or bundle a demand comes out of
packages.py          ``PackageStore``          runtime_env packages for nodes to fetch
logs.py              ``LogFanout``             which driver prints which worker's lines
runs.py              ``RunStore``              training runs drivers publish, for the dashboard
dashboard/           ``Dashboard``             the read-only web dashboard (aiohttp, optional)
server.py            ``Head``                  RPC endpoints, pushes, calls to nodes, waits
===================  ========================  ==============================================
"""

from .server import Head, main, run_head

__all__ = ["Head", "main", "run_head"]
