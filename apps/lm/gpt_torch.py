"""``gpt_tiny_torch``: a decoder-only transformer in PyTorch, nanoGPT's shape.

Token and position embeddings, ``layers`` pre-norm blocks (LayerNorm, causal
self-attention through ``scaled_dot_product_attention(is_causal=True)``, LayerNorm, an MLP
of 4x width with GELU), a final LayerNorm, and logits from the token embedding itself
(tied: ``F.linear(x, tok.weight)``, so the matrix is one ``state_dict`` entry and crosses
the wire once). Weights start normal(0, 0.02) from the module's own generator
(``seed``), biases and LayerNorm as PyTorch makes them: the same start as ``gpt_tiny``.

Its ``default_optimizer()`` is what the PyTorch adapter uses when the run passes no
``optimizer=``: AdamW with nanoGPT's settings (``schedule.DEFAULTS``; weight decay on
matrices only), gradients clipped to norm 1, the rate warmed up and decayed by its own
step count (``schedule.warmup_cosine``), which its state carries: a checkpoint or a
replacement continues the schedule where it was.

torch is imported when a model is built, never at module import (forkserver rule).
"""

from __future__ import annotations

from .schedule import DEFAULTS, warmup_cosine, warmup_for
from .sizes import resolve_size

__all__ = ["gpt_tiny_torch"]

_CLASSES: dict = {}


def gpt_tiny_torch(vocab_size: int = 256, context: int = 128, size: str = "tiny", *,
                   layers: int | None = None, heads: int | None = None, dim: int | None = None,
                   dropout: float = 0.0, learning_rate: float = DEFAULTS["learning_rate"],
                   weight_decay: float = DEFAULTS["weight_decay"],
                   warmup_steps: int | None = None, total_steps: int | None = None,
                   batch_size: int | None = None, seed: int = 0):
    """A GPT of ``size`` (``sizes.SIZES``; ``layers``/``heads``/``dim`` override it) over
    ``vocab_size`` ids and windows of at most ``context``, as a ``torch.nn.Module`` from
    ids ``(batch, time)`` to logits ``(batch, time, vocab_size)``. ``total_steps``: the
    optimizer steps the cosine decays over (each trainer's, see
    ``lm.steps_per_trainer``); None keeps the peak after the warm-up. ``warmup_steps``:
    100, or a tenth of ``total_steps`` when that is less. ``batch_size``: the batch those
    steps are of (``lm.steps_per_trainer``'s); given, the schedule follows samples, so a
    trainer stepping on a smaller batch (``scheme="auto"`` splitting it) warms up and
    decays over the same samples; None: it counts steps of whatever batch."""
    shape = resolve_size(size, layers, heads, dim)   # a bad shape is refused without torch
    import torch

    GPT = _classes()["GPT"]
    model = GPT(int(vocab_size), int(context), shape["layers"], shape["heads"], shape["dim"],
                float(dropout))
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name.endswith("bias"):
                p.zero_()
    model.hyper = {"learning_rate": float(learning_rate), "weight_decay": float(weight_decay),
                   "warmup_steps": warmup_for(warmup_steps, total_steps),
                   "total_steps": None if total_steps is None else int(total_steps),
                   "batch_size": None if batch_size is None else int(batch_size)}
    model.settings = {"vocab_size": int(vocab_size), "context": int(context), **shape,
                      "dropout": float(dropout), "seed": int(seed), **model.hyper}
    return model


def _classes() -> dict:
    """The module classes, made once per process (torch imported here)."""
    if _CLASSES:
        return _CLASSES
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, dim, heads, dropout):
            super().__init__()
            self.heads, self.dropout = heads, dropout
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for z in (q, k, v))
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, dim, heads, dropout):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.attn = Attention(dim, heads, dropout)
            self.ln2 = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, 4 * dim)
            self.out = nn.Linear(4 * dim, dim)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            x = x + self.drop(self.attn(self.ln1(x)))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        """ids (batch, time) -> logits (batch, time, vocab); tied output embedding."""

        def __init__(self, vocab, context, layers, heads, dim, dropout):
            super().__init__()
            if dim % heads:
                raise ValueError(f"dim={dim} is not a multiple of heads={heads}")
            self.vocab_size, self.context = vocab, context
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(context, dim)
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim)
            self.hyper: dict = {}
            self.settings: dict = {}

        def forward(self, ids):
            t = ids.shape[1]
            if t > self.context:
                raise ValueError(f"a window of {t} tokens, longer than this model's context "
                                 f"of {self.context}")
            if ids.numel() and int(ids.max()) >= self.vocab_size:
                raise ValueError(
                    f"token id {int(ids.max())} is outside this model's vocabulary of "
                    f"{self.vocab_size}: build it with vocab_size=dataset.vocab_size")
            x = self.drop(self.tok(ids) + self.pos.weight[:t])
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln_f(x), self.tok.weight)

        def default_optimizer(self):
            h = {**DEFAULTS, **self.hyper}
            decay = [p for p in self.parameters() if p.dim() >= 2]
            rest = [p for p in self.parameters() if p.dim() < 2]
            return ScheduledAdamW(
                [{"params": decay, "weight_decay": h["weight_decay"]},
                 {"params": rest, "weight_decay": 0.0}],
                peak=h["learning_rate"], warmup_steps=h["warmup_steps"],
                total_steps=h["total_steps"], alpha=h["alpha"], clip_norm=h["clip_norm"],
                betas=(h["beta_1"], h["beta_2"]), schedule_batch=h.get("batch_size"))

    class ScheduledAdamW(torch.optim.AdamW):
        """AdamW whose rate follows ``warmup_cosine`` of the steps it has taken (its
        ``step`` state, so checkpoints carry the schedule), clipping gradients first.
        With ``schedule_batch`` the schedule is in steps of that batch: steps of another
        (``set_step_batch``, which the adapter's ``fit`` calls) count as their share of
        one, so the schedule follows samples."""

        def __init__(self, groups, peak, warmup_steps, total_steps, alpha, clip_norm,
                     betas, schedule_batch=None):
            super().__init__(groups, lr=0.0, betas=betas)
            self.schedule = (float(peak), int(warmup_steps), total_steps, float(alpha))
            self.clip_norm = clip_norm
            self.schedule_batch = schedule_batch
            self.step_batch = schedule_batch

        def set_step_batch(self, batch_size: int) -> None:
            self.step_batch = int(batch_size)

        def step_schedule(self) -> str:
            if self.schedule[2] is None and self.schedule[1] == 0:
                return "none"
            return "samples" if self.schedule_batch else "steps"

        def steps_taken(self) -> int:
            for group in self.param_groups:
                for p in group["params"]:
                    step = self.state.get(p, {}).get("step")
                    if step is not None:
                        return int(step)
            return 0

        @torch.no_grad()
        def step(self, closure=None):
            taken = self.steps_taken()
            if self.schedule_batch and self.step_batch:
                taken = taken * self.step_batch / self.schedule_batch
            rate = warmup_cosine(taken, *self.schedule)
            for group in self.param_groups:
                group["lr"] = rate
            if self.clip_norm:
                params = [p for g in self.param_groups for p in g["params"]
                          if p.grad is not None]
                torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
            return super().step(closure)

    _CLASSES.update(GPT=GPT, ScheduledAdamW=ScheduledAdamW)
    return _CLASSES
