"""Progress reporting from remote code: :class:`tqdm`, a line-based progress bar.

    from ddlf_actors.util.progress import tqdm

    @ddlf.remote
    def f(name):
        for x in tqdm(range(100), desc=name):
            ...

A worker's stdout reaches the driver line by line, prefixed with its process
(``(f pid=1234) task 1:  40%|████      | 40/100 [00:04<00:06, 9.9it/s]``). Terminal
progress bars redraw one line with carriage returns, which a line-forwarding log cannot
carry, so this bar prints whole lines instead, at most one per ``mininterval`` seconds,
plus a last one when it closes. It mirrors ``tqdm``'s and Ray's ``tqdm_ray``'s common
API (iterate, ``update``, ``set_description``, ``close``, context manager); Ray instead
draws every worker's bar in place in the driver's terminal.
"""

from __future__ import annotations

import sys
import time

__all__ = ["tqdm"]

_WIDTH = 20


class tqdm:  # noqa: N801 - the name users of tqdm and Ray's tqdm_ray import
    def __init__(self, iterable=None, desc: str | None = None, total: int | None = None,
                 position: int | None = None, unit: str = "it", mininterval: float = 1.0,
                 file=None, disable: bool = False, **_ignored):
        self.iterable = iterable
        if total is None and iterable is not None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        self.total = total
        self.desc = desc or ""
        self.unit = unit
        self.n = 0
        self.position = position
        self.mininterval = float(mininterval)
        self.disable = disable
        self._file = file
        self._start = time.monotonic()
        self._last_print = float("-inf")
        self._closed = False

    # -- the tqdm API ------------------------------------------------------------------------
    def __iter__(self):
        if self.iterable is None:
            raise TypeError("tqdm() without an iterable cannot be iterated; call update(n)")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self):
        return self.total or 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last_print >= self.mininterval:
            self._print(now)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""
        if refresh:
            self.refresh()

    def set_postfix(self, *args, **kwargs) -> None:
        pass  # a one-line summary has no room for it; accepted so tqdm code runs unchanged

    def refresh(self) -> None:
        self._print(time.monotonic())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._print(time.monotonic())

    # -- output ------------------------------------------------------------------------------
    def line(self, now: float | None = None) -> str:
        """The progress line as it would be printed now."""
        elapsed = (time.monotonic() if now is None else now) - self._start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            frac = min(1.0, self.n / self.total)
            filled = int(frac * _WIDTH)
            bar = "█" * filled + " " * (_WIDTH - filled)
            left = (self.total - self.n) / rate if rate > 0 else 0.0
            return (f"{head}{frac * 100:3.0f}%|{bar}| {self.n}/{self.total} "
                    f"[{_clock(elapsed)}<{_clock(left)}, {rate:.1f}{self.unit}/s]")
        return f"{head}{self.n}{self.unit} [{_clock(elapsed)}, {rate:.1f}{self.unit}/s]"

    def _print(self, now: float) -> None:
        self._last_print = now
        if self.disable:
            return
        out = self._file or sys.stdout
        print(self.line(now), file=out, flush=True)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
