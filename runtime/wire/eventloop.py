"""Event loop selection: uvloop where available, and a loop running in a daemon thread."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["new_event_loop", "LoopThread"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # Windows, or uvloop not installed: the stdlib loop works too
        return asyncio.new_event_loop()


class LoopThread:
    """An event loop running forever in a daemon thread (the driver's I/O thread)."""

    def __init__(self, name: str = "ddlf-io"):
        self.loop = new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    def run(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()
