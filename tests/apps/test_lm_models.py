"""The GPTs (issue 32): ``models.gpt_tiny_torch`` and ``models.gpt_tiny`` (Keras 3).

Small shapes (1-2 blocks, dim 16-32), so each test takes a second or two once its
framework is imported. What is checked: the shape and parameter count the docs state,
the tied output, causality (a later token never changes an earlier prediction), the
refusals (a window past the context, an id past the vocabulary), the optimizer (AdamW
with warm-up and cosine decay, weight decay on matrices only, the schedule carried in
the optimizer's state), that the adapters train it on token windows, and generation.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddlf_actors.apps import frameworks, lm, models
from ddlf_actors.apps.datasets import tokenizer as tk
from ddlf_actors.apps.lm import schedule
from ddlf_actors.apps.lm.generate import generate, sample_ids

SMALL = dict(layers=2, heads=2, dim=32)


def _windows(n=64, context=16, seed=0):
    """A learnable sequence: a repeating pattern of 8 ids with a little noise."""
    rng = np.random.default_rng(seed)
    stream = np.tile(np.arange(8) * 3 + 40, n * context // 8 + 2)
    noise = rng.random(stream.shape) < 0.05
    stream = np.where(noise, rng.integers(0, 256, stream.shape), stream)
    starts = np.arange(n) * context
    x = np.stack([stream[s:s + context] for s in starts]).astype(np.int32)
    y = np.stack([stream[s + 1:s + context + 1] for s in starts]).astype(np.int32)
    return x, y


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def keras():
    from ddlf_actors.apps import tf_startup

    pytest.importorskip("tensorflow")
    with tf_startup.quiet_startup():
        import keras
    return keras


def test_the_sizes_have_the_parameters_the_docs_state():
    assert lm.count_params(256, 128, **lm.SIZES["tiny"]) == 842_496
    assert lm.count_params(256, 256, **lm.SIZES["small"]) == 6_142_464
    with pytest.raises(ValueError, match="multiple of heads"):
        models.gpt_tiny_torch(256, 16, dim=30, heads=4)
    with pytest.raises(ValueError, match="unknown GPT size"):
        lm.GptModelFn(vocab_size=256, context=16, size="huge")()


def test_torch_gpt_shape_ties_its_output_and_is_causal(torch):
    model = models.gpt_tiny_torch(256, 16, **SMALL)
    sd = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == lm.count_params(256, 16, **SMALL)
    assert list(sd)[0] == "tok.weight" and tuple(sd["tok.weight"].shape) == (256, 32)
    assert not any("head" in k for k in sd)          # the output is the token matrix
    ids = torch.randint(0, 256, (2, 16))
    out = model(ids)
    assert tuple(out.shape) == (2, 16, 256)
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    again = model(changed)
    assert torch.equal(out[:, :10], again[:, :10]) and not torch.equal(out[:, 10:], again[:, 10:])
    with torch.no_grad():                               # tied: the logits move with tok
        model.tok.weight[7] += 1.0
    assert not torch.equal(model(ids)[..., 7], out[..., 7])


def test_torch_gpt_refuses_long_windows_and_ids_past_its_vocabulary(torch):
    model = models.gpt_tiny_torch(100, 8, **SMALL)
    with pytest.raises(ValueError, match="longer than this model's context of 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 150 is outside this model's vocabulary "
                                         "of 100.*vocab_size=dataset.vocab_size"):
        model(torch.full((1, 4), 150, dtype=torch.long))


def test_torch_gpt_optimizer_warms_up_decays_and_carries_its_schedule(torch):
    model = models.gpt_tiny_torch(256, 16, **SMALL, learning_rate=2e-3, warmup_steps=4,
                                  total_steps=20)
    adapter = frameworks.for_model(model)(model, {})
    opt = adapter.optimizer
    assert type(opt).__name__ == "ScheduledAdamW"
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])
    x, y = _windows(n=48)
    rates = []
    for k in range(6):
        adapter.fit(x[8 * k:8 * k + 8], y[8 * k:8 * k + 8], 1, 8)
        rates.append(adapter.get_learning_rate())
    # The rate of each step is warmup_cosine of the steps taken before it.
    assert rates == pytest.approx([schedule.warmup_cosine(k, 2e-3, 4, 20) for k in range(6)])
    state = adapter.get_optimizer_state()
    fresh = models.gpt_tiny_torch(256, 16, **SMALL, learning_rate=2e-3, warmup_steps=4,
                                  total_steps=20)
    other = frameworks.for_model(fresh)(fresh, {})
    other.set_optimizer_state(state)
    other.set_weights(adapter.get_weights())
    other.fit(x[:8], y[:8], 1, 8)
    assert other.get_learning_rate() == pytest.approx(schedule.warmup_cosine(6, 2e-3, 4, 20))


def test_torch_gpt_schedule_follows_samples_when_told_its_batch(torch):
    # Built for steps of 8 (batch_size=8): a trainer stepping on 4 (auto splitting the
    # batch 2 ways) takes two steps per step of the schedule, so it warms up and decays
    # over the same samples; told nothing, the schedule counts steps of any batch.
    model = models.gpt_tiny_torch(256, 16, **SMALL, learning_rate=2e-3, warmup_steps=4,
                                  total_steps=20, batch_size=8)
    adapter = frameworks.for_model(model)(model, {})
    assert adapter.step_schedule() == "samples"
    x, y = _windows(n=48)
    rates = []
    for k in range(6):
        adapter.fit(x[4 * k:4 * k + 4], y[4 * k:4 * k + 4], 1, 4)
        rates.append(adapter.get_learning_rate())
    assert rates == pytest.approx([schedule.warmup_cosine(k / 2, 2e-3, 4, 20) for k in range(6)])
    plain = models.gpt_tiny_torch(256, 16, **SMALL, warmup_steps=4, total_steps=20)
    assert frameworks.for_model(plain)(plain, {}).step_schedule() == "steps"
    flat = models.gpt_tiny_torch(256, 16, **SMALL, warmup_steps=0)
    assert frameworks.for_model(flat)(flat, {}).step_schedule() == "none"


def test_torch_adapter_trains_the_gpt_on_token_windows(torch):
    model = models.gpt_tiny_torch(256, 16, **SMALL, learning_rate=3e-3, warmup_steps=2)
    adapter = frameworks.for_model(model)(model, {})
    x, y = _windows()
    before, _ = adapter.evaluate(x, y)
    for _ in range(8):
        adapter.fit(x, y, 1, 16)
    after, acc = adapter.evaluate(x, y)
    assert after < before - 1.0 and acc > 0.5
    assert before == pytest.approx(np.log(256), abs=0.5)


def test_keras_gpt_has_the_torch_shapes_is_causal_and_trains(keras):
    from ddlf_actors.apps import keras_steps

    model = models.gpt_tiny(256, 16, **SMALL, learning_rate=3e-3, warmup_steps=2)
    assert model.count_params() == lm.count_params(256, 16, **SMALL)
    w = model.get_weights()
    assert w[0].shape == (256, 32) and w[1].shape == (16, 32)
    ids = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
    out = np.asarray(model(ids))
    changed = ids.copy()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    again = np.asarray(model(changed))
    np.testing.assert_allclose(out[:, :10], again[:, :10], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out[:, 10:], again[:, 10:])
    adapter = frameworks.for_model(model)(model, {})
    x, y = _windows()
    before, _ = adapter.evaluate(x, y)
    for _ in range(8):
        keras_steps.fit_steps(model, x, y, 1, 16)
    after, acc = adapter.evaluate(x, y)
    assert after < before - 1.0 and acc > 0.5


def test_keras_gpt_schedule_is_the_same_function(keras):
    model = models.gpt_tiny(256, 16, **SMALL, learning_rate=2e-3, warmup_steps=4,
                            total_steps=20)
    rate = model.optimizer.learning_rate
    sched = model.optimizer._learning_rate
    for step in (0, 2, 4, 10, 20, 30):
        assert float(sched(step)) == pytest.approx(schedule.warmup_cosine(step, 2e-3, 4, 20),
                                                   rel=1e-5, abs=1e-9)
    assert float(rate) == 0.0   # step 0
    # Keras' schedule counts the optimizer's iterations: auto keeps the batch of a run.
    assert frameworks.for_model(model)(model, {}).step_schedule() == "steps"
    excluded = [v for v in model.trainable_variables if len(v.shape) < 2]
    assert excluded and all(model.optimizer._use_weight_decay(v) is False for v in excluded)


def test_keras_gpt_saved_weights_load_into_a_model_built_for_generation(keras, tmp_path):
    model = models.gpt_tiny(256, 16, **SMALL, seed=3)
    path = str(tmp_path / "model.keras")
    model.save(path)
    back = models.gpt_tiny(256, 16, **SMALL, seed=99, compile=False)
    back.load_weights(path)
    for a, b in zip(model.get_weights(), back.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_generation_is_seeded_and_stops_at_a_documents_end(torch):
    model = models.gpt_tiny_torch(256, 16, **SMALL)
    tok = tk.make("byte")
    a = generate(model, tok, "Hi", 20, context=16, seed=1, stop=False)
    b = generate(model, tok, "Hi", 20, context=16, seed=1, stop=False)
    assert a == b and a.startswith("Hi") and len(a.encode("utf-8", "replace")) > 2

    class Separator(torch.nn.Module):       # always predicts the separator (id 0)
        def forward(self, ids):
            out = torch.zeros(*ids.shape, 256)
            out[..., 0] = 10.0
            return out

    assert sample_ids(Separator(), [0, 5], 10, 16, temperature=0, stop_id=0) == []
    assert sample_ids(Separator(), [0, 5], 3, 16, temperature=0) == [0, 0, 0]
    with pytest.raises(TypeError, match="prompt must be a str"):
        generate(model, tok, b"x", 3, context=16)
