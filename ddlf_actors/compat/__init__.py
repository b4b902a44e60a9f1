"""Compatibility layers that let programs written for other frameworks run on DDLF.

``ddlf_actors.compat.ray`` maps Ray Core's public API onto DDLF; ``python -m
ddlf_actors.compat.ray script.py`` runs an unmodified Ray script on DDLF.
"""

__all__: list = []
