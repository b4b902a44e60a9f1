"""``python -m ddlf_actors.runtime.head``: run a head (see ``server.main``)."""

from .server import main

main()
