"""Remote classes and functions defined in an ordinary importable module.

Workers import this module by reference (the driver ships its ``sys.path``).
"""

from __future__ import annotations

import os

import ddlf_actors as ddlf


@ddlf.remote
class Accumulator:
    def __init__(self, start=0):
        self.total = start

    def add(self, x):
        self.total += x
        return self.total

    def pid(self):
        return os.getpid()


@ddlf.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def incr(self, by=1):
        self.n += by
        return self.n

    def read(self):
        return self.n

    def pid(self):
        return os.getpid()


@ddlf.remote
def square(x):
    return x * x
