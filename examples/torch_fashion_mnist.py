"""Train a PyTorch module on Fashion-MNIST with DDLF: two trainers, DDLF's sync defaults.

    pip install -e ".[train,torch]"
    python examples/torch_fashion_mnist.py [--workers 2] [--master-epochs 2] [--limit N]

The model is the paper's CNN written in PyTorch (``models.paper_cnn_torch``; it takes the
dataset's NHWC images and outputs logits). Each trainer builds it with ``model_fn``, and
its optimizer with ``optimizer=`` (a callable from the parameters: each trainer builds its
own); ``loss=`` defaults to cross-entropy. ``result.model`` is the module with the final
weights, and ``result.weights`` its ``state_dict()`` values. Every scheme, fault path,
checkpoint and codec works as for Keras (``docs/training.md``).
"""

from __future__ import annotations

import argparse
import functools
import os

import ddlf_actors as ddlf
from ddlf_actors.apps import datasets, models, train_sync
from ddlf_actors.apps.report import format_table


def sgd_momentum(params, lr: float = 0.01):
    import torch

    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def first_images(n: int):
    """The first ``n`` training images (and ``n // 6`` test images): a quick run."""
    (x, y), (xt, yt) = datasets.load("fashion-mnist")
    return (x[:n], y[:n]), (xt[:n // 6], yt[:n // 6])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--master-epochs", type=int, default=2)
    p.add_argument("--limit", type=int, help="train on the first N images only")
    p.add_argument("--out", default="runs/torch-fashion-mnist")
    args = p.parse_args()

    datasets.ensure("fashion-mnist")   # on this machine, or fetched
    dataset = functools.partial(first_images, args.limit) if args.limit else "fashion-mnist"
    ddlf.init()
    try:
        result = train_sync(models.paper_cnn_torch, dataset, workers=args.workers,
                            master_epochs=args.master_epochs, batch_size=32,
                            optimizer=sgd_momentum)
    finally:
        ddlf.shutdown()
    print(format_table(result.history))

    import torch

    model = result.model.eval()            # the module, holding the final weights
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.pt")
    torch.save(model.state_dict(), path)   # load: model.load_state_dict(torch.load(path))
    (_, _), (x_test, y_test) = datasets.load("fashion-mnist")
    with torch.no_grad():
        logits = model(torch.from_numpy(x_test[:1000]))
    accuracy = (logits.argmax(1).numpy() == y_test[:1000]).mean()
    print(f"wrote {path}; accuracy of result.model on 1,000 test images: {accuracy:.4f}")


if __name__ == "__main__":
    main()
