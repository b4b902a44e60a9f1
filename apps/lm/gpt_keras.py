"""``gpt_tiny``: the decoder-only transformer of ``gpt_tiny_torch``, in Keras 3.

Token and position embeddings (one layer, :class:`TokenAndPosition`, called again with
``reverse=True`` for the tied output logits), ``layers`` pre-norm blocks (LayerNorm,
``MultiHeadAttention`` with ``use_causal_mask=True``, LayerNorm, a 4x GELU MLP), a final
LayerNorm. Weights normal(0, 0.02) from a ``keras.random.SeedGenerator(seed)``, so the
same ``seed`` builds the same model in every process. The same shapes and parameter count
as the PyTorch one (``sizes.py``).

Compiled with AdamW (``schedule.DEFAULTS``: weight decay on matrices only, global norm
clipped to 1) on Keras' ``CosineDecay`` with warm-up, which is ``schedule.warmup_cosine``,
and sparse cross-entropy on the logits with accuracy (of the next token). The step count
is the optimizer's ``iterations``, in its state: checkpoints carry the schedule.

Keras is imported when a model is built, never at module import (forkserver rule).
"""

from __future__ import annotations

from .schedule import DEFAULTS, warmup_for
from .sizes import resolve_size

__all__ = ["gpt_tiny"]

_CLASSES: dict = {}
# Keras' CosineDecay with no total: decay over more steps than any run takes.
_NO_DECAY = 10 ** 12


def gpt_tiny(vocab_size: int = 256, context: int = 128, size: str = "tiny", *,
             layers: int | None = None, heads: int | None = None, dim: int | None = None,
             dropout: float = 0.0, learning_rate: float = DEFAULTS["learning_rate"],
             weight_decay: float = DEFAULTS["weight_decay"],
             warmup_steps: int | None = None, total_steps: int | None = None,
             batch_size: int | None = None,
             seed: int = 0, compile: bool = True):
    """A compiled Keras GPT of ``size`` from ids ``(batch, time)``, time at most
    ``context``, to logits ``(batch, time, vocab_size)``; arguments as ``gpt_tiny_torch``
    (``compile=False``: no optimizer, to load saved weights and generate)."""
    import keras
    from keras import layers as kl

    shape = resolve_size(size, layers, heads, dim)
    c = _classes()
    gen = keras.random.SeedGenerator(int(seed))
    init = keras.initializers.RandomNormal(stddev=0.02, seed=gen)
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    embed = c["TokenAndPosition"](int(vocab_size), int(context), shape["dim"], init,
                                  name="embed")
    x = embed(ids)
    if dropout:
        x = kl.Dropout(dropout, seed=int(seed))(x)
    for i in range(shape["layers"]):
        x = c["Block"](shape["dim"], shape["heads"], float(dropout), init, name=f"block{i}")(x)
    x = kl.LayerNormalization(epsilon=1e-5, name="ln_f")(x)
    logits = embed(x, reverse=True)
    model = keras.Model(ids, logits, name="gpt_tiny")
    model.settings = {"vocab_size": int(vocab_size), "context": int(context), **shape,
                      "dropout": float(dropout), "seed": int(seed),
                      "learning_rate": float(learning_rate), "weight_decay": float(weight_decay),
                      "warmup_steps": warmup_for(warmup_steps, total_steps),
                      "total_steps": None if total_steps is None else int(total_steps)}
    if not compile:
        return model
    h = {**DEFAULTS, "learning_rate": float(learning_rate), "weight_decay": float(weight_decay),
         "warmup_steps": warmup_for(warmup_steps, total_steps)}
    decay = _NO_DECAY if total_steps is None else max(1, int(total_steps) - h["warmup_steps"])
    rate = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=decay, alpha=h["alpha"], warmup_target=h["learning_rate"],
        warmup_steps=h["warmup_steps"])
    optimizer = keras.optimizers.AdamW(rate, weight_decay=h["weight_decay"],
                                       beta_1=h["beta_1"], beta_2=h["beta_2"],
                                       global_clipnorm=h["clip_norm"])
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _classes() -> dict:
    """The layer classes, made and registered once per process (Keras imported here)."""
    if _CLASSES:
        return _CLASSES
    import keras
    from keras import layers as kl
    from keras import ops

    @keras.saving.register_keras_serializable(package="ddlf_gpt")
    class TokenAndPosition(kl.Layer):
        """ids -> token + position embeddings; ``reverse=True``: vectors -> logits over
        the tokens, through the same token matrix (the tied output)."""

        def __init__(self, vocab_size, context, dim, initializer="random_normal", **kw):
            super().__init__(**kw)
            self.vocab_size, self.context, self.dim = vocab_size, context, dim
            self.initializer = keras.initializers.get(initializer)

        def build(self, input_shape):
            self.tok = self.add_weight(shape=(self.vocab_size, self.dim), name="tok",
                                       initializer=self.initializer)
            self.pos = self.add_weight(shape=(self.context, self.dim), name="pos",
                                       initializer=self.initializer)

        def call(self, inputs, reverse=False):
            if reverse:
                return ops.matmul(inputs, ops.transpose(self.tok))
            t = ops.shape(inputs)[1]
            return ops.take(self.tok, inputs, axis=0) + self.pos[:t]

        def get_config(self):
            return {**super().get_config(), "vocab_size": self.vocab_size,
                    "context": self.context, "dim": self.dim,
                    "initializer": keras.initializers.serialize(self.initializer)}

    @keras.saving.register_keras_serializable(package="ddlf_gpt")
    class Block(kl.Layer):
        """x + attn(ln1(x)), then + mlp(ln2(x)): one pre-norm transformer block."""

        def __init__(self, dim, heads, dropout=0.0, initializer="random_normal", **kw):
            super().__init__(**kw)
            self.dim, self.heads, self.dropout = dim, heads, dropout
            init = keras.initializers.get(initializer)
            self.initializer = init
            self.ln1 = kl.LayerNormalization(epsilon=1e-5)
            self.attn = kl.MultiHeadAttention(heads, key_dim=dim // heads, dropout=dropout,
                                              kernel_initializer=init)
            self.ln2 = kl.LayerNormalization(epsilon=1e-5)
            self.fc = kl.Dense(4 * dim, activation="gelu", kernel_initializer=init)
            self.out = kl.Dense(dim, kernel_initializer=init)
            self.drop = kl.Dropout(dropout)

        def build(self, input_shape):
            self.ln1.build(input_shape)
            self.attn.build(input_shape, input_shape)
            self.ln2.build(input_shape)
            self.fc.build(input_shape)
            self.out.build((*input_shape[:-1], 4 * self.dim))

        def call(self, x, training=False):
            h = self.ln1(x)
            x = x + self.drop(self.attn(h, h, use_causal_mask=True, training=training),
                              training=training)
            return x + self.drop(self.out(self.fc(self.ln2(x))), training=training)

        def compute_output_shape(self, input_shape):
            return input_shape

        def get_config(self):
            return {**super().get_config(), "dim": self.dim, "heads": self.heads,
                    "dropout": self.dropout,
                    "initializer": keras.initializers.serialize(self.initializer)}

    _CLASSES.update(TokenAndPosition=TokenAndPosition, Block=Block)
    return _CLASSES
