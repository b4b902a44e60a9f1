"""The training pieces that need no cluster: plans, averaging, checkpoints, config, shards."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlf_actors.apps import TrainConfig, checkpoint
from ddlf_actors.apps.schemes.averaging import apply_delta, weighted_mean
from ddlf_actors.apps.schemes.evaluation import ShardedEvaluation
from ddlf_actors.apps.schemes.plan import Plan, split_shares


# -- plans -------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 500), rounds=st.integers(1, 6),
       ks=st.lists(st.integers(1, 5), min_size=6, max_size=6), seed=st.integers(0, 2**31))
def test_each_sample_once_per_epoch_whatever_k_each_round(n, rounds, ks, seed):
    plan = Plan(seed, rounds, n)
    seen = []
    for r in range(rounds):
        slots = list(range(ks[r]))
        pieces = plan.round_pieces(1, r, slots)
        assert sorted(pieces) == slots
        sizes = [len(p) for p in pieces.values()]
        assert max(sizes) - min(sizes) <= 1        # even shares
        for p in pieces.values():
            seen.extend(p.tolist())
    assert sorted(seen) == list(range(n))


def test_plan_is_a_function_of_seed_and_epoch_only():
    a, b = Plan(3, 2, 100), Plan(3, 2, 100)
    b.round_pieces(1, 0, [0, 1])   # b has been used; a has not
    np.testing.assert_array_equal(a.permutation(2), b.permutation(2))
    assert not np.array_equal(a.permutation(1), a.permutation(2))
    assert not np.array_equal(Plan(4, 2, 100).permutation(1), a.permutation(1))


def test_partitioned_plan_uses_each_partitions_own_indices():
    plan = Plan(0, 2, 30, part_sizes={0: 10, 1: 20})
    first = plan.round_pieces(1, 0, [0, 1])
    second = plan.round_pieces(1, 1, [1])     # trainer 0 absent this round
    assert sorted(first[0].tolist() + plan.round_pieces(1, 1, [0])[0].tolist()) == list(range(10))
    assert sorted(first[1].tolist() + second[1].tolist()) == list(range(20))


def test_split_shares_follows_the_shares():
    pieces = split_shares(np.arange(100), [1, 3])
    assert [len(p) for p in pieces] == [25, 75]
    assert np.concatenate(pieces).tolist() == list(range(100))


# -- averaging ---------------------------------------------------------------------------------
def test_weighted_mean_weighs_by_samples_and_equals_the_mean_for_equal_shares():
    d1 = [np.full((2, 2), 1.0, np.float32), np.full(3, 2.0, np.float32)]
    d2 = [np.full((2, 2), 4.0, np.float32), np.full(3, 8.0, np.float32)]
    np.testing.assert_allclose(weighted_mean([d1, d2], [1, 1])[0], 2.5)
    out = weighted_mean([d1, d2], [300, 100])
    np.testing.assert_allclose(out[0], 1.75)
    np.testing.assert_allclose(out[1], 3.5)
    assert out[0].dtype == np.float32
    with pytest.raises(ValueError):
        weighted_mean([], [])
    with pytest.raises(ValueError):
        weighted_mean([d1], [0])


def test_apply_delta_keeps_each_weights_dtype():
    w = [np.ones(3, np.float32), np.ones(2, np.float64)]
    out = apply_delta(w, [np.ones(3, np.float64), np.ones(2, np.float32)], 0.5)
    assert [a.dtype for a in out] == [np.float32, np.float64]
    np.testing.assert_allclose(out[0], 0.5)
    assert w[0][0] == 1.0     # a new list: the old weights stay as they were


# -- checkpoints -------------------------------------------------------------------------------
def _ckpt(round_no, value=1.0):
    return checkpoint.Checkpoint(
        round=round_no, weights=[np.full((3, 2), value, np.float32), np.arange(4)],
        meta={"scheme": "sync", "history": [{"round": 1, "test_accuracy": 0.5}], "events": []},
        optimizer_states={1: [np.zeros(2), np.array(7)]},
        arrays={"pending0": [np.ones(2)]})


def test_checkpoint_round_trip_without_pickle(tmp_path):
    path = checkpoint.save(str(tmp_path), _ckpt(3))
    assert os.path.basename(path) == "ckpt-00000003.npz"
    back = checkpoint.load(str(tmp_path))
    assert back.round == 3 and back.history == [{"round": 1, "test_accuracy": 0.5}]
    np.testing.assert_array_equal(back.weights[0], np.full((3, 2), 1.0, np.float32))
    np.testing.assert_array_equal(back.weights[1], np.arange(4))
    assert int(back.optimizer_states[1][1]) == 7
    np.testing.assert_array_equal(back.arrays["pending0"][0], np.ones(2))
    with np.load(path, allow_pickle=False) as z:   # every member loads without pickle
        assert all(z[k] is not None for k in z.keys())


def test_checkpoints_keep_the_newest_and_ignore_half_written_files(tmp_path):
    for r in (1, 2, 3):
        checkpoint.save(str(tmp_path), _ckpt(r, value=float(r)), keep=2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.npz", "ckpt-00000003.npz"]
    # A writer killed mid-write leaves only its temp file: readers never pick it up.
    (tmp_path / ".ckpt-00000004.npz.tmp-1-2").write_bytes(b"PK\x03\x04 half")
    assert checkpoint.load(str(tmp_path)).round == 3
    # A damaged final file (a disk error) is skipped for the one before it, with a warning.
    (tmp_path / "ckpt-00000003.npz").write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match="unreadable checkpoint"):
        assert checkpoint.load(str(tmp_path)).round == 2


def test_checkpoint_writer_reports_failures_and_goes_on(tmp_path):
    errors, done = [], []
    target = tmp_path / "file"
    target.write_text("not a directory")
    writer = checkpoint.CheckpointWriter(str(target), on_done=lambda *a: done.append(a),
                                         on_error=errors.append)
    writer.submit(_ckpt(1))
    writer.close()
    assert errors and not done
    writer = checkpoint.CheckpointWriter(str(tmp_path / "ok"), on_done=lambda *a: done.append(a),
                                         on_error=errors.append)
    writer.submit(_ckpt(1))
    writer.submit(_ckpt(2))
    writer.close()
    assert [c.round for c, _path, _t in done] == [1, 2] and writer.written == 2


def test_fingerprint_differences_are_named():
    a = {"model": {"fn": "m", "weights": [[[2], "<f4"]]}, "dataset": {"what": "x", "num_train": 5}}
    b = {"model": {"fn": "m", "weights": [[[3], "<f4"]]}, "dataset": {"what": "x", "num_train": 6}}
    diffs = checkpoint.compare_fingerprints(a, b)
    assert diffs == ['model weights: checkpoint has [[[2], "<f4"]], this run has [[[3], "<f4"]]',
                     "dataset num_train: checkpoint has 5, this run has 6"]
    assert checkpoint.compare_fingerprints(a, a) == []


# -- config ------------------------------------------------------------------------------------
def test_workers_range_makes_an_elastic_run():
    cfg = TrainConfig(workers=(2, 4))
    assert (cfg.workers, cfg.min_workers, cfg.elastic, cfg.start_workers) == (4, 2, True, 2)
    fixed = TrainConfig(workers=3)
    assert (fixed.min_workers, fixed.elastic, fixed.start_workers) == (1, False, 3)
    for bad in ((3, 2), (0, 2), (1, 2, 3), (1.5, 2)):
        with pytest.raises(ValueError, match="workers=\\(lo, hi\\)"):
            TrainConfig(workers=bad)
    with pytest.raises(ValueError, match="contradicts"):
        TrainConfig(workers=(2, 4), min_workers=3)
    with pytest.raises(ValueError, match="min_workers=3 is more than workers=2"):
        TrainConfig(workers=2, min_workers=3)


def test_checkpoint_options_and_unknown_options():
    cfg = TrainConfig(checkpoint_dir="~/x")
    assert cfg.checkpoint_every == 1 and os.path.isabs(cfg.checkpoint_dir)
    with pytest.raises(ValueError, match="checkpoint_every needs checkpoint_dir"):
        TrainConfig(checkpoint_every=2)
    from ddlf_actors.apps.schemes import split_options

    with pytest.raises(TypeError, match="unknown option 'worker'; did you mean 'workers'"):
        split_options("sync", {"worker": 2}, caller="train_sync")
    assert TrainConfig(workers=(1, 2)).to_json()["workers"] == 2


# -- sharded evaluation ------------------------------------------------------------------------
def _calls():
    """A machine's call factory: numbered Call orders (no trainer is called)."""
    import itertools

    from ddlf_actors.apps.schemes.orders import Call

    ids = itertools.count(1)
    return lambda slot, spec, kind: Call(next(ids), slot, spec[0], spec[1], spec[2], kind)


def test_a_lost_trainers_shard_is_queued_on_another():
    a, b = "slot a", "slot b"
    ev = ShardedEvaluation({"round": 1}, "w", num_test=10, make_call=_calls())
    ca, cb = ev.submit([a, b])
    assert (ca.slot, ca.method, ca.args) == (a, "evaluate", ("w", (0, 2)))
    assert (cb.slot, cb.args) == (b, ("w", (1, 2))) and ca.kind == "evaluate"
    ev.record(ca.id, (1.0, 0.5))
    (new,) = ev.reassign(cb.id, [a])      # b was lost: its shard 1 of 2 goes to a
    assert new.slot == a and new.args == ("w", (1, 2)) and not ev.done
    ev.record(new.id, (3.0, 1.0))
    assert ev.done
    row = ev.finish()
    assert row["test_loss"] == pytest.approx(2.0) and row["test_accuracy"] == pytest.approx(0.75)
    ev2 = ShardedEvaluation({"round": 2}, "w", num_test=10, make_call=_calls())
    (c,) = ev2.submit([a])
    assert ev2.reassign(c.id, []) == [] and ev2.orphaned
    (again,) = ev2.requeue_orphans([b])
    assert again.slot == b and not ev2.orphaned


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), rounds=st.integers(1, 40), k=st.integers(1, 6),
       batch=st.sampled_from([1, 8, 32]))
def test_pieces_are_whole_batches_but_the_epochs_last(n, rounds, k, batch):
    """Every row once per epoch, and every piece whole batches except the epoch's last
    piece (or rows, when there are fewer batches than pieces): a piece of 513 rows at
    batch 32 ended every round in a one-sample step."""
    plan = Plan(seed=3, rounds_per_epoch=rounds, num_train=n, batch_size=batch)
    pieces = [p for r in range(rounds) for p in plan.round_pieces(0, r, list(range(k))).values()]
    assert sorted(np.concatenate(pieces).tolist()) == list(range(n))
    if n // batch >= rounds * k:   # enough batches for every piece
        assert all(len(p) % batch == 0 for p in pieces[:-1]), [len(p) for p in pieces]


def test_sixty_thousand_rows_in_117_rounds_are_rounds_of_whole_batches():
    plan = Plan(seed=1, rounds_per_epoch=117, num_train=60000, batch_size=32)
    sizes = {len(plan.round_pieces(0, r, [0])[0]) for r in range(117)}
    assert sizes <= {512, 544}        # 16 or 17 batches; evenly cut it was 512 and 513
