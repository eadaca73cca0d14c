"""tinylm.TransformerLM (forward, loss_and_grads, generate, state dicts) and
tinylm.train, against the float64 NumPy reference model."""

import json

import numpy as np
import pytest

import tinylm
from reference import RNG, lm_weights, ref_cross_entropy, ref_lm

CONFIG = dict(vocab_size=40, context_length=12, d_model=16, num_layers=2, num_heads=4, d_ff=24, rope_theta=10000.0)


def model_and_weights():
    w = {k: v.astype(np.float32) for k, v in lm_weights(40, 16, 24, 2).items()}
    model = tinylm.TransformerLM(CONFIG)
    model.load_state_dict(w)
    return model, {k: v.astype(np.float64) for k, v in w.items()}


def ref_loss(w, ids, targets):
    return ref_cross_entropy(ref_lm(ids, w, 2, 4, 10000.0), targets)


def test_forward_equals_reference():
    model, w = model_and_weights()
    ids = RNG.integers(0, 40, size=(2, 3, 9))
    logits = model.forward(ids)
    assert logits.dtype == np.float32 and logits.shape == (2, 3, 9, 40)
    np.testing.assert_allclose(logits, ref_lm(ids, w, 2, 4, 10000.0), atol=5e-4, rtol=1e-4)
    state = model.state_dict()
    assert set(state) == set(w)
    for k in w:
        np.testing.assert_array_equal(state[k], w[k].astype(np.float32))


def test_loss_and_grads_equal_finite_differences():
    model, w = model_and_weights()
    ids = RNG.integers(0, 40, size=(2, 7))
    targets = RNG.integers(0, 40, size=(2, 7))
    loss, grads = model.loss_and_grads(ids, targets)
    assert loss == pytest.approx(ref_loss(w, ids, targets), rel=1e-5)
    assert set(grads) == set(w)
    eps = 1e-6
    for name, g in grads.items():
        assert g.dtype == np.float32 and g.shape == w[name].shape
        # The directional derivative along a random direction, by central differences.
        u = RNG.standard_normal(g.shape)
        plus = dict(w, **{name: w[name] + eps * u})
        minus = dict(w, **{name: w[name] - eps * u})
        numeric = (ref_loss(plus, ids, targets) - ref_loss(minus, ids, targets)) / (2 * eps)
        assert float((g * u).sum()) == pytest.approx(numeric, rel=2e-3, abs=1e-5), name
        # And a few single coordinates.
        for _ in range(3):
            idx = tuple(RNG.integers(0, s) for s in g.shape)
            e = np.zeros(g.shape)
            e[idx] = eps
            plus = dict(w, **{name: w[name] + e})
            minus = dict(w, **{name: w[name] - e})
            numeric = (ref_loss(plus, ids, targets) - ref_loss(minus, ids, targets)) / (2 * eps)
            assert g[idx] == pytest.approx(numeric, rel=5e-3, abs=2e-5), (name, idx)


def test_errors():
    model, w = model_and_weights()
    with pytest.raises(ValueError, match="outside"):
        model.forward(np.array([[40]]))
    with pytest.raises(ValueError):
        model.forward(RNG.integers(0, 40, size=(1, 13)))
    with pytest.raises(ValueError, match="do not match"):
        model.loss_and_grads(np.zeros((2, 3), dtype=np.int64), np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="unexpected 'extra'"):
        model.load_state_dict(dict(w, extra=np.zeros(1)))
    with pytest.raises(ValueError, match="has shape"):
        model.load_state_dict(dict(w, **{"ln_final.weight": np.zeros(3)}))
    with pytest.raises(ValueError, match="divisible"):
        tinylm.TransformerLM(dict(CONFIG, num_heads=3))
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        tinylm.TransformerLM.from_pretrained("missing.safetensors")
    with pytest.raises(ValueError, match="unknown field"):
        tinylm.TransformerLM(dict(CONFIG, d_modle=3))


def test_generate_greedy_and_seeded():
    model, _ = model_and_weights()
    prompt = [1, 2, 3]
    out = model.generate(prompt, 20, temperature=0.0)
    assert len(out) == 20
    seq = list(prompt)
    for token in out:  # greedy: each token is the argmax of a full forward pass
        window = np.array([seq[-CONFIG["context_length"]:]])
        assert token == int(np.argmax(model.forward(window)[0, -1]))
        seq.append(token)
    a = model.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=5)
    assert a == model.generate(prompt, 10, temperature=1.0, top_p=0.9, seed=5)
    stop = out[4]
    assert model.generate(prompt, 20, temperature=0.0, eos_id=stop) == out[: out.index(stop)]
    with pytest.raises(ValueError, match="top_p"):
        model.generate(prompt, 5, top_p=0.0)


def test_train_and_from_pretrained(tmp_path):
    tokens = RNG.integers(0, 40, size=4000).astype(np.uint16)
    np.save(tmp_path / "train.npy", tokens)
    np.save(tmp_path / "val.npy", tokens[:600])
    config = {
        "model": CONFIG,
        "train_data": tmp_path / "train.npy",  # a path object works too
        "val_data": str(tmp_path / "val.npy"),
        "out_dir": str(tmp_path / "run"),
        "batch_size": 4,
        "steps": 6,
        "warmup_steps": 2,
        "eval_interval": 3,
        "checkpoint_interval": 3,
        "log_interval": 1,
        "threads": 1,
    }
    run = tinylm.train(config)
    assert str(run) == str(tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 6
    model = tinylm.TransformerLM.from_pretrained(run)
    assert model.config["d_model"] == 16
    m, opt, it, meta = tinylm.checkpoint.load(tmp_path / "run" / "checkpoint.safetensors")
    assert it == 6 and set(m) == set(model.state_dict())
    assert any(k.startswith("m.") for k in opt)
    (tmp_path / "config.json").write_text(json.dumps(dict(config, out_dir=str(tmp_path / "run2")), default=str))
    assert str(tinylm.train(str(tmp_path / "config.json"))) == str(tmp_path / "run2")
    model_toml = "\n".join(f"{k} = {v}" for k, v in CONFIG.items())
    (tmp_path / "config.toml").write_text(
        f'train_data = "{tmp_path / "train.npy"}"\nout_dir = "{tmp_path / "run3"}"\n'
        f"batch_size = 2\nsteps = 2\nthreads = 1\n[model]\n{model_toml}\n"
    )
    run3 = tinylm.train(tmp_path / "config.toml")
    assert (run3 / "checkpoint.safetensors").exists()
    with pytest.raises(FileNotFoundError):
        tinylm.train(dict(config, train_data=str(tmp_path / "missing.npy")))
    with pytest.raises(ValueError, match="unknown field"):
        tinylm.train(dict(config, stepz=3))


def test_train_resume_continues_the_recorded_run(tmp_path):
    tokens = RNG.integers(0, 40, size=4000).astype(np.uint16)
    np.save(tmp_path / "train.npy", tokens)
    config = {
        "model": CONFIG,
        "train_data": str(tmp_path / "train.npy"),
        "batch_size": 4,
        "steps": 12,
        "cosine_steps": 12,
        "warmup_steps": 2,
        "checkpoint_interval": 0,
        "log_interval": 1,
        "threads": 1,
    }

    def log(run):
        return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]

    straight = tinylm.train(dict(config, out_dir=str(tmp_path / "straight")))
    # The same run cut after step 5 (its schedule still ends at step 12), then
    # resumed with only the steps changed: the losses of the run that never stopped.
    half = tinylm.train(dict(config, out_dir=str(tmp_path / "half"), steps=5))
    ckpt = half / "checkpoint.safetensors"
    assert log(half)[-1]["step"] == 5
    assert tinylm.train({"resume": ckpt, "steps": 12}) == half
    assert log(half) == [dict(r, wallclock_s=h["wallclock_s"], tokens_per_s=h["tokens_per_s"])
                         for r, h in zip(log(straight), log(half))]
    assert len(log(half)) == 12
    # The recorded run is at its end; the model cannot change.
    with pytest.raises(ValueError, match="nothing to do"):
        tinylm.train({"resume": ckpt})
    with pytest.raises(ValueError, match="'model.d_model' 32 \\(the checkpoint's d_model is 16\\)"):
        tinylm.train({"resume": ckpt, "steps": 20, "model": {"d_model": 32}})


def test_device_argument():
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        tinylm.TransformerLM(CONFIG, device="gpu")
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        tinylm.TransformerLM(CONFIG, device="cpu", precision="fp16")
    cpu = tinylm.TransformerLM(CONFIG, seed=3, device="cpu")
    ids = RNG.integers(0, 40, size=(2, 9))
    try:
        gpu = tinylm.TransformerLM(CONFIG, seed=3, device="cuda", precision="fp32")
    except ValueError as e:
        # A build without the cuda feature, or no usable GPU: one clear line.
        assert "CUDA" in str(e) or "cuda" in str(e), e
        return
    np.testing.assert_allclose(gpu.forward(ids), cpu.forward(ids), rtol=1e-4, atol=1e-5)


def test_preset_config_is_the_engines_table():
    tiny = tinylm.preset_config("tinystories")
    assert (tiny["vocab_size"], tiny["d_model"], tiny["num_layers"], tiny["d_ff"]) == (10_000, 512, 4, 1344)
    small = tinylm.preset_config("bench-small")
    model = tinylm.TransformerLM({**small, "vocab_size": 50, "context_length": 8})
    assert model.config["d_model"] == 256
    with pytest.raises(ValueError, match="unknown preset 'nope'.*bench-small"):
        tinylm.preset_config("nope")
