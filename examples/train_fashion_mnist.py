"""Train the paper's CNN on Fashion-MNIST with the functional API, both schemes.

    python examples/train_fashion_mnist.py [--master-epochs 2] [--workers 2]
"""

from __future__ import annotations

import argparse

import ddlf_actors as ddlf
from ddlf_actors.apps import datasets, models, train_async, train_sync
from ddlf_actors.apps.report import format_table

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=2)
p.add_argument("--master-epochs", type=int, default=2)
args = p.parse_args()

datasets.ensure("fashion-mnist")  # on this machine, or fetched (URL, then apt)
ddlf.init()
try:
    sync = train_sync(models.paper_cnn, "fashion-mnist", workers=args.workers,
                      master_epochs=args.master_epochs, worker_epochs=1, batch_size=32)
    print("synchronous\n" + format_table(sync.history))
    asyn = train_async(models.paper_cnn, "fashion-mnist", workers=args.workers,
                       master_epochs=args.master_epochs, worker_epochs=1, batch_size=32,
                       staleness_bound=None)
    print("asynchronous\n" + format_table(asyn.history))
finally:
    ddlf.shutdown()
