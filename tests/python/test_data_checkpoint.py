"""tinylm.data.get_batch (the documented generator) and tinylm.checkpoint."""

import io

import numpy as np
import pytest

import tinylm
from tinylm import checkpoint, data

MASK = (1 << 64) - 1


def splitmix_below(state, k):
    """The generator of the training loop, as its documentation gives it."""
    limit = (1 << 64) - ((1 << 64) % k)
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        x = z ^ (z >> 31)
        if x < limit:
            return state, x % k


def test_get_batch_windows_and_seed(tmp_path):
    tokens = np.random.default_rng(2).integers(0, 1000, size=5000).astype(np.uint16)
    path = tmp_path / "tokens.npy"
    np.save(path, tokens)
    mapped = np.load(path, mmap_mode="r")
    x, y = data.get_batch(mapped, 8, 16, seed=7)
    assert x.dtype == np.int64 and y.dtype == np.int64
    assert x.shape == (8, 16) and y.shape == (8, 16)
    state, starts = 7, []
    for _ in range(8):
        state, s = splitmix_below(state, 5000 - 16)
        starts.append(s)
    for row, s in enumerate(starts):
        assert (x[row] == tokens[s : s + 16]).all()
        assert (y[row] == tokens[s + 1 : s + 17]).all()
    x2, _ = data.get_batch(tokens.astype(np.int32), 8, 16, seed=7)
    assert (x2 == x).all()
    x3, _ = data.get_batch(tokens, 8, 16)
    assert x3.shape == (8, 16)


def test_get_batch_errors():
    with pytest.raises(ValueError, match="too short"):
        data.get_batch(np.arange(10), 2, 10)
    with pytest.raises(ValueError, match="1-D integer"):
        data.get_batch(np.zeros((4, 4), dtype=np.int64), 2, 2)
    with pytest.raises(ValueError, match="1-D integer"):
        data.get_batch(np.zeros(40), 2, 2)


def states():
    rng = np.random.default_rng(3)
    model = {"a.weight": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(5)}
    opt = {"m.a.weight": rng.standard_normal((3, 4)).astype(np.float32), "v.a.weight": np.ones((3, 4))}
    return model, opt


@pytest.mark.parametrize("binary", [False, True])
def test_checkpoint_round_trip(tmp_path, binary):
    model, opt = states()
    target = io.BytesIO() if binary else tmp_path / "ckpt.safetensors"
    checkpoint.save(target, model, opt, 42, {"note": "hello"})
    if binary:
        target.seek(0)
    m2, o2, it, meta = checkpoint.load(target)
    assert it == 42 and meta["note"] == "hello"
    assert set(m2) == set(model) and set(o2) == set(opt)
    for k in model:
        assert m2[k].dtype == np.float32
        np.testing.assert_array_equal(m2[k], model[k].astype(np.float32))
    for k in opt:
        np.testing.assert_array_equal(o2[k], opt[k].astype(np.float32))


def test_checkpoint_errors(tmp_path):
    model, opt = states()
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="safetensors"):
        checkpoint.load(bad)
    with pytest.raises(ValueError, match="reserved"):
        checkpoint.save(tmp_path / "x", model, opt, 1, {"iteration": "3"})
    with pytest.raises(ValueError, match="reserved"):
        checkpoint.save(tmp_path / "x", {"optim.x": np.ones(2)}, {}, 1)
    with pytest.raises((FileNotFoundError, OSError)):
        checkpoint.save(tmp_path / "no" / "dir" / "x", model, opt, 1)


def test_top_level_names():
    for name in ("train_bpe", "Tokenizer", "TransformerLM", "train", "nn", "optim", "data", "checkpoint"):
        assert hasattr(tinylm, name)
