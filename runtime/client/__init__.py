"""The client side: what a driver (or a worker that calls other actors) runs.

The core and its I/O thread, the owner's object store, dependency resolution, the actor
and task submitters, generator streams, ``ObjectRef`` and the out-of-band fetch of refs
pickled inside values. It builds on ``wire``; the head and node daemons never import it.
"""
