"""A run's TensorBoard event files, read by TensorBoard's own reader, hold every
scalar of its log.jsonl and its configuration."""

import json

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tinylm

MODEL = dict(vocab_size=256, context_length=32, d_model=64, num_layers=2, num_heads=4, d_ff=128, rope_theta=10_000.0)


def test_event_files_equal_the_log(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "train.npy", rng.integers(0, 256, 20_000).astype(np.uint16))
    np.save(tmp_path / "val.npy", rng.integers(0, 256, 4_000).astype(np.uint16))
    run = tinylm.train(
        {
            "model": MODEL,
            "train_data": str(tmp_path / "train.npy"),
            "val_data": str(tmp_path / "val.npy"),
            "out_dir": str(tmp_path / "run"),
            "steps": 30,
            "batch_size": 4,
            "eval_interval": 10,
            "log_interval": 5,
        }
    )
    log = [json.loads(line) for line in open(f"{run}/log.jsonl")]
    events = EventAccumulator(f"{run}/tensorboard", size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for tag, key in [("train/loss", "train_loss"), ("val/loss", "val_loss"), ("lr", "lr"),
                     ("grad_norm", "grad_norm"), ("tokens_per_s", "tokens_per_s")]:
        want = [(r["step"], r[key]) for r in log if r.get(key) is not None]
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in want], tag
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6, err_msg=tag)
    config = events.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert '"d_model": 64' in config


def test_a_resumed_run_replaces_what_followed_its_checkpoint(tmp_path):
    """A run killed after its checkpoint logged steps that the resumed run logs again:
    TensorBoard keeps the resumed run's values only, equal to log.jsonl's."""
    import shutil

    rng = np.random.default_rng(1)
    np.save(tmp_path / "train.npy", rng.integers(0, 256, 20_000).astype(np.uint16))
    config = {
        "model": MODEL,
        "train_data": str(tmp_path / "train.npy"),
        "out_dir": str(tmp_path / "run"),
        "batch_size": 4,
        "log_interval": 2,
        "steps": 10,
    }
    run = tinylm.train(config)
    shutil.copy(f"{run}/checkpoint.safetensors", tmp_path / "step10.safetensors")
    tinylm.train({"resume": f"{run}/checkpoint.safetensors", "steps": 20})
    # As if the run had been killed at step 20 after its checkpoint of step 10.
    tinylm.train({"resume": str(tmp_path / "step10.safetensors"), "steps": 20, "lr_max": 3e-3,
                  "out_dir": str(run)})
    log = [json.loads(line) for line in open(f"{run}/log.jsonl")]
    events = EventAccumulator(f"{run}/tensorboard", size_guidance={"scalars": 0})
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in got] == [r["step"] for r in log] == list(range(2, 21, 2))
    np.testing.assert_allclose([v for _, v in got], [r["train_loss"] for r in log], rtol=1e-6)
