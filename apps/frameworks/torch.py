"""The PyTorch adapter: a ``torch.nn.Module`` that outputs logits, and an optimizer the
adapter builds for it.

Run options (``options``, from ``optimizer=`` and ``loss=``):

* ``optimizer``: a callable taking the module's parameters and returning a
  ``torch.optim.Optimizer``. Default: the module's own ``default_optimizer()`` if it has
  one (``models.gpt_tiny_torch``: AdamW with warm-up and cosine decay), else
  ``torch.optim.Adam(params, lr=1e-3)``, what ``models.paper_cnn`` compiles for Keras (chosen
  on a validation split: docs/training.md, "the defaults"; it was SGD 0.01, the paper's).
* ``loss``: a callable ``(output, target) -> scalar tensor``, the mean over the batch.
  Default ``torch.nn.functional.cross_entropy``: the module outputs logits; for a
  sequence of them (``(batch, time, classes)``, a language model's) the mean over every
  position.

What the schemes see (:meth:`TorchAdapter.get_weights`) is every ``state_dict()`` value in
``state_dict()`` order, buffers included: BatchNorm's running statistics are averaged like
the weights, and its integer ``num_batches_tracked`` stays an integer array
(``schemes/averaging.py`` keeps integer arrays integer).

Images reach the module as float32 tensors in the dataset's layout (NHWC, as Keras takes
them); labels as int64. A module that wants NCHW permutes in ``forward``
(``models.paper_cnn_torch`` shows how). Integer inputs (a text dataset's token windows)
reach it as int64, for an embedding.

torch is imported here only inside methods: a node's forkserver imports this module
(through ``ddlf_actors.apps``), and torch's thread pools are not fork-safe once started.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .base import FrameworkAdapter, eval_batch_size
from .torch_imports import finish_torch_imports

__all__ = ["TorchAdapter"]


def _default_optimizer(params):
    """What ``paper_cnn`` compiles for Keras (its default, ``models.OPTIMIZERS``), so that
    a PyTorch model trains as the Keras one does unless the run's ``optimizer=`` says
    otherwise."""
    import torch

    from ..models import OPTIMIZERS

    return torch.optim.Adam(params, lr=OPTIMIZERS["adam"])


def _default_loss(output, target):
    import torch.nn.functional as F

    if output.dim() > 2:   # (batch, time, classes): every position's prediction
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def _input_dtype(x):
    """float32 for features, int64 for ids (a text dataset's windows, an embedding's)."""
    return np.int64 if np.asarray(x[:0]).dtype.kind in "iu" else np.float32


def _module_optimizer(model):
    """The module's ``default_optimizer`` as an ``optimizer=`` callable, or None."""
    own = getattr(model, "default_optimizer", None)
    if not callable(own):
        return None
    return lambda params: own()


def _numpy(t) -> np.ndarray:
    """A tensor's values as a numpy array of their own (never a view of the tensor: the
    trainer takes weights before and after training and subtracts them)."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:   # numpy has no bfloat16; set_weights casts back
        t = t.float()
    return t.cpu().numpy().copy()


def _tensor(a, dtype):
    """A CPU tensor of ``a``: zero-copy where numpy allows, a copy for a read-only array
    (the trainers' datasets are read-only memory maps, and torch will not wrap those)."""
    import torch

    a = np.ascontiguousarray(a, dtype=dtype)
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


class TorchAdapter(FrameworkAdapter):
    name = "torch"
    model_file = "model.pt"

    def __init__(self, model: Any, options: dict | None = None):
        import torch

        super().__init__(model, options)
        make_optimizer = self.options.get("optimizer") or _module_optimizer(model) \
            or _default_optimizer
        if isinstance(make_optimizer, torch.optim.Optimizer):
            raise TypeError(
                "optimizer= takes a callable that builds the optimizer from the parameters, "
                "e.g. optimizer=lambda params: torch.optim.SGD(params, lr=0.03, momentum=0.9); "
                "an Optimizer instance holds the parameters of a model built elsewhere")
        if not callable(make_optimizer):
            raise TypeError(f"optimizer= must be a callable taking the parameters and "
                            f"returning a torch.optim.Optimizer, got {make_optimizer!r}")
        # Its first optimizer's lazy import, made once per process and safely where
        # TensorFlow is loaded too (torch_imports.py: the CUDA build's triton crashed there).
        finish_torch_imports()
        self.optimizer = make_optimizer(model.parameters())
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer= returned a {type(self.optimizer).__qualname__}, "
                            "not a torch.optim.Optimizer")
        self.loss_fn = self.options.get("loss") or _default_loss
        if not callable(self.loss_fn):
            raise TypeError(f"loss= must be a callable (output, target) -> scalar tensor, "
                            f"got {self.loss_fn!r}")

    # -- which models, and the process ---------------------------------------------------------
    @classmethod
    def owns(cls, model: Any) -> bool:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(model, torch.nn.Module):
            return False
        # Keras 3 on its torch backend makes every keras.Model a torch.nn.Module too; such
        # a model is trained through Keras (compile, its optimizer), not through this.
        keras = sys.modules.get("keras")
        return keras is None or not isinstance(model, keras.Model)

    @classmethod
    def configure_threads(cls, n: int) -> None:
        """``n`` intra-op threads and one inter-op thread.

        torch allows ``set_num_threads`` at any time, so this may run after ``model_fn``
        built the model. ``set_num_interop_threads`` works once per process, and only
        before inter-op parallel work started; a second call (or one after such work)
        raises ``RuntimeError``, in which case the pool torch has stays (measured with
        torch 2.13: building and training a module does not start it)."""
        os.environ["OMP_NUM_THREADS"] = str(n)   # for anything the trainer starts after
        import torch

        torch.set_num_threads(int(n))
        if torch.get_num_interop_threads() != 1:
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:   # already set in this process, or inter-op work ran
                pass

    # -- weights -------------------------------------------------------------------------------
    def _state_tensors(self) -> list:
        import torch

        return [t for t in self.model.state_dict().values() if isinstance(t, torch.Tensor)]

    def get_weights(self) -> list[np.ndarray]:
        return [_numpy(t) for t in self._state_tensors()]

    def buffer_mask(self) -> list[bool]:
        """``state_dict`` entries that are buffers (BatchNorm's ``running_mean``,
        ``running_var``, ``num_batches_tracked``), not parameters; in ``get_weights``'
        order. A parameter shared under two names is a parameter under both."""
        import torch

        params = {name for name, _ in self.model.named_parameters(remove_duplicate=False)}
        return [name not in params for name, t in self.model.state_dict().items()
                if isinstance(t, torch.Tensor)]

    def set_weights(self, weights) -> None:
        import torch

        tensors = self._state_tensors()
        if len(tensors) != len(weights):
            raise ValueError(f"{len(weights)} arrays for a module whose state_dict holds "
                             f"{len(tensors)} tensors")
        for i, (t, w) in enumerate(zip(tensors, weights)):
            if tuple(t.shape) != np.shape(w):
                raise ValueError(f"array {i} has shape {np.shape(w)}, the module's "
                                 f"state_dict tensor {i} has {tuple(t.shape)}")
        # In place: state_dict() tensors share storage with the parameters and buffers, and
        # the optimizer keeps referring to the same parameters.
        with torch.no_grad():
            for t, w in zip(tensors, weights):
                w = np.asarray(w)
                if not w.flags.writeable:   # weights from the object store are read-only,
                    w = w.copy()            # and torch warns (once, to the terminal) on those
                t.copy_(torch.from_numpy(w))

    # -- training ------------------------------------------------------------------------------
    def fit(self, x, y, epochs: int, batch_size: int) -> float:
        import torch

        model, opt, loss_fn = self.model, self.optimizer, self.loss_fn
        xt, yt = _tensor(x, _input_dtype(x)), _tensor(y, np.int64)
        n = len(xt)
        model.train()
        if hasattr(opt, "set_step_batch"):   # a schedule that follows samples (lm.gpt_torch)
            opt.set_step_batch(batch_size)
        mean = 0.0
        for _ in range(int(epochs)):
            total = torch.zeros((), dtype=torch.float64)
            for start in range(0, n, batch_size):
                xb, yb = xt[start:start + batch_size], yt[start:start + batch_size]
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(xb), yb)
                loss.backward()
                opt.step()
                total += loss.detach().double() * len(xb)
            mean = float(total) / n if n else 0.0
        return mean

    # -- data-parallel: a gradient per batch, a step with the averaged one ----------------------
    def _trained(self) -> list:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def compute_gradients(self, x, y) -> tuple[list, float]:
        import torch

        model = self.model
        model.train()
        params = self._trained()
        for p in params:
            p.grad = None
        loss = self.loss_fn(model(_tensor(x, _input_dtype(x))), _tensor(y, np.int64))
        loss.backward()
        grads = [np.zeros(tuple(p.shape), _numpy(p.detach()).dtype) if p.grad is None
                 else _numpy(p.grad) for p in params]
        with torch.no_grad():
            for p in params:
                p.grad = None
        return grads, float(loss.detach())

    def apply_gradients(self, grads) -> None:
        import torch

        params = self._trained()
        if len(params) != len(grads):
            raise ValueError(f"{len(grads)} gradients for an optimizer of {len(params)} "
                             "parameters")
        for p, g in zip(params, grads):
            g = np.asarray(g)
            p.grad = torch.from_numpy(g if g.flags.writeable else g.copy()).to(p.dtype)
        self.optimizer.step()
        for p in params:
            p.grad = None

    def evaluate(self, x, y, batch_size: int = 512) -> tuple[float, float]:
        import torch

        model = self.model
        xt, yt = _tensor(x, _input_dtype(x)), _tensor(y, np.int64)
        n = len(xt)
        if n == 0:
            return 0.0, 0.0
        batch_size = eval_batch_size(x, batch_size)
        was_training = model.training
        model.eval()
        loss_sum, correct = 0.0, 0.0
        try:
            with torch.no_grad():
                for start in range(0, n, batch_size):
                    xb, yb = xt[start:start + batch_size], yt[start:start + batch_size]
                    out = model(xb)
                    loss_sum += float(self.loss_fn(out, yb)) * len(xb)
                    hits = (out.argmax(dim=-1) == yb).double()
                    # A sequence's accuracy is the share of its positions predicted.
                    correct += float(hits.reshape(len(xb), -1).mean(dim=1).sum())
        finally:
            model.train(was_training)
        return loss_sum / n, correct / n

    # -- optimizer ------------------------------------------------------------------------------
    # The flat form of ``optimizer.state_dict()``: first an int64 array of the parameter
    # indices that have state (in the order the param groups list them), then for each of
    # those parameters its state values by sorted key, then any tensor-valued
    # hyperparameter of the param groups (group order, sorted key). Python numbers in the
    # state become 0-d arrays and come back as the same type. The learning rate and the
    # other hyperparameters are not state: the optimizer callable and the run set them.
    def _flat_state(self) -> list:
        """The values of ``optimizer.state_dict()`` in the flat order above."""
        import torch

        sd = self.optimizer.state_dict()
        order = [i for g in sd["param_groups"] for i in g["params"]]
        with_state = [i for i in order if sd["state"].get(i)]
        values: list = [np.asarray(with_state, dtype=np.int64)]
        for i in with_state:
            for key in sorted(sd["state"][i]):
                values.append(sd["state"][i][key])
        for g in sd["param_groups"]:
            for key in sorted(g):
                if key != "params" and isinstance(g[key], torch.Tensor):
                    values.append(g[key])
        return values

    def get_optimizer_state(self) -> list | None:
        import torch

        values = self._flat_state()
        if len(values) == 1 and not len(values[0]):
            return None   # no state yet, or none at all (SGD without momentum)
        return [_numpy(v) if isinstance(v, torch.Tensor) else np.asarray(v) for v in values]

    def reset_optimizer_state(self) -> None:
        # torch makes a parameter's state (moments, step) at its first step: none is fresh.
        self.optimizer.state.clear()

    def set_optimizer_state(self, state) -> None:
        import torch

        state = list(state)
        if not state:
            return
        wanted = [int(i) for i in np.asarray(state[0]).ravel()]
        sd = self.optimizer.state_dict()
        if any(not sd["state"].get(i) for i in wanted):
            self._create_state()   # torch creates state at the first step
            sd = self.optimizer.state_dict()
        per_param = {i: sorted(sd["state"].get(i) or ()) for i in wanted}
        if any(not keys for keys in per_param.values()):
            raise ValueError(f"optimizer state for parameters {wanted} does not fit this "
                             f"model's {type(self.optimizer).__qualname__}: it has "
                             f"{len([i for g in sd['param_groups'] for i in g['params']])} "
                             "parameters, and no state for some of them after one step")
        group_slots = [(gi, key) for gi, g in enumerate(sd["param_groups"]) for key in sorted(g)
                       if key != "params" and isinstance(g[key], torch.Tensor)]
        expected = 1 + sum(len(k) for k in per_param.values()) + len(group_slots)
        if expected != len(state):
            raise ValueError(f"optimizer state of {len(state)} arrays does not fit this "
                             f"model's {type(self.optimizer).__qualname__} ({expected} "
                             "arrays for the parameters the state names)")
        new_state = {}
        k = 1
        for i in wanted:
            entry = {}
            for key in per_param[i]:
                entry[key] = _restore(sd["state"][i][key], state[k], f"state[{i}][{key!r}]")
                k += 1
            new_state[i] = entry
        for gi, key in group_slots:
            sd["param_groups"][gi][key] = _restore(sd["param_groups"][gi][key], state[k],
                                                   f"param_groups[{gi}][{key!r}]")
            k += 1
        sd["state"] = new_state
        self.optimizer.load_state_dict(sd)

    def _create_state(self) -> None:
        """One optimizer step on zero gradients, with every parameter put back afterwards:
        torch creates an optimizer's state (momentum buffers, Adam moments, step counts) at
        its first step, and :meth:`set_optimizer_state` overwrites all of it."""
        import torch

        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        saved = [p.detach().clone() for p in params]
        grads = [p.grad for p in params]
        try:
            for p in params:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
            self.optimizer.step()
        except Exception as e:   # an optimizer that needs a closure (LBFGS), say
            raise ValueError(f"cannot load optimizer state into a fresh "
                             f"{type(self.optimizer).__qualname__}: its first step, which "
                             f"creates the state, failed ({e})") from e
        finally:
            with torch.no_grad():
                for p, s, g in zip(params, saved, grads):
                    p.copy_(s)
                    p.grad = g

    def step_schedule(self) -> str:
        """An optimizer with ``step_schedule()`` says how its schedule counts (the GPT's
        ``ScheduledAdamW``); any other has none that DDLF steps (DDLF never calls a torch
        ``LRScheduler``)."""
        own = getattr(self.optimizer, "step_schedule", None)
        return own() if callable(own) else "none"

    def get_learning_rate(self) -> float | None:
        groups = self.optimizer.param_groups
        if not groups or "lr" not in groups[0]:
            return None
        return float(groups[0]["lr"])

    def set_learning_rate(self, rate: float) -> None:
        import torch

        for g in self.optimizer.param_groups:
            if isinstance(g.get("lr"), torch.Tensor):
                g["lr"].fill_(float(rate))   # a tensor rate (capturable/fused): in place
            else:
                g["lr"] = float(rate)

    # -- the driver's side ---------------------------------------------------------------------
    @classmethod
    def local_model(cls, model_fn, weights, options=None):
        """``model_fn()`` holding ``weights``, in the mode ``model_fn`` left it in (train
        mode for a new module: call ``.eval()`` before inference). No optimizer is built."""
        model = model_fn()
        if not cls.owns(model):
            raise TypeError(f"model_fn returned a {type(model).__qualname__}, not a "
                            "torch.nn.Module")
        cls._bare(model, options).set_weights(weights)
        return model

    @classmethod
    def weights_of(cls, model) -> list[np.ndarray]:
        return cls._bare(model).get_weights()

    @classmethod
    def _bare(cls, model, options=None) -> TorchAdapter:
        """An adapter for weights only: no optimizer on the driver."""
        adapter = cls.__new__(cls)
        FrameworkAdapter.__init__(adapter, model, options)
        return adapter

    @classmethod
    def save(cls, model, path: str) -> None:
        """``torch.save(model.state_dict(), path)``. The state dict, not the pickled module:
        loading it needs no pickled code (``torch.load(path)`` with its default
        ``weights_only=True``) and no class importable under the same name, which a module
        defined inside ``model_fn`` (as ``models.paper_cnn_torch``'s is) would not be. Load
        it with ``model = model_fn(); model.load_state_dict(torch.load(path))``."""
        import torch

        torch.save(model.state_dict(), path)


def _restore(template, value, where: str):
    """``value`` (a numpy array) in the form of ``template`` (a tensor or a number)."""
    import torch

    value = np.asarray(value)
    if isinstance(template, torch.Tensor):
        if tuple(template.shape) != value.shape:
            raise ValueError(f"optimizer {where}: shape {value.shape} where this optimizer "
                             f"has {tuple(template.shape)}")
        return torch.from_numpy(np.array(value, copy=True)).to(template.dtype)
    if isinstance(template, (bool, int, float)):
        return type(template)(value.item())
    raise ValueError(f"optimizer {where}: cannot restore a {type(template).__qualname__}")
