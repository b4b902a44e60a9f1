"""The DDLF paper's Example 1 (Examples 3.4-3.7 in its Vietnamese part), on DDLF actors.

A synchronous distributed training application: the App loads the dataset and creates
the paper's CNN on the master and on every worker, trains with train_sync, evaluates,
and saves the model. Fashion-MNIST by default (same format as MNIST):

    python examples/paper_app_mnist.py                       # embedded 2-CPU cluster
    python examples/paper_app_mnist.py --dataset mnist       # needs the MNIST files
    python examples/paper_app_mnist.py --address 10.0.0.5:6380 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio

from ddlf_actors.apps import App, datasets, models


class PaperApp(App):
    async def load_dataset(self):
        # Example 2: load, make sure images are (28, 28, 1), normalise to [-0.5, 0.5].
        # datasets.load does all three and reads from the node's cache or the network.
        (self.x_train, self.y_train), (self.x_test, self.y_test) = datasets.load_shared(
            self.dataset)

    async def create_model(self):
        # Example 3: Conv2D(32) → MaxPool → Conv2D(64) → Flatten → Dense(64) → Dense(10).
        self.model = models.paper_cnn(input_shape=self.x_train.shape[1:])


async def main(args):
    datasets.ensure(args.dataset)  # on this machine, or fetched (URL, then apt)
    app = PaperApp(workers=args.workers, dataset=args.dataset, address=args.address)
    await app.connect()
    await app.load_dataset()
    await app.create_model()
    await app.train_sync(master_epochs=args.master_epochs, worker_epochs=args.worker_epochs,
                         batch_size=32)
    print(await app.evaluate_model())
    print("saved", await app.save_model(args.out))
    await app.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--master-epochs", type=int, default=2)
    p.add_argument("--worker-epochs", type=int, default=1)
    p.add_argument("--address", default=None)
    p.add_argument("--out", default="paper_app_model.keras")
    asyncio.run(main(p.parse_args()))
