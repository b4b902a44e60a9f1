"""The wire: what travels between DDLF processes and how.

Addresses, the token handshake and TLS, framed connections, frame kinds and their
dispatch tables, the control plane's typed messages and its request/reply layer, the typed
call body, serialization of values and remote errors, and the event loop that runs all of
it. Every process kind (driver, head, node, worker) builds on this package; it imports
nothing from ``client``, ``head``, ``node`` or ``worker``.
"""
