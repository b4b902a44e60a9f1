"""``python -m ddlf_actors.runtime.node``: run a node daemon (see ``main.main``)."""

from .main import main

main()
