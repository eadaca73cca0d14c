"""tinylm.optim against the SPEC's check values and NumPy float64 references."""

import math

import numpy as np
import pytest

from tinylm import optim

RNG = np.random.default_rng(1)


def ref_schedule(t, lr_max, lr_min, warmup, cycle):
    if t < warmup:
        return lr_max * t / warmup
    if t <= cycle:
        return lr_min + 0.5 * (1 + math.cos(math.pi * (t - warmup) / (cycle - warmup))) * (lr_max - lr_min)
    return lr_min


def test_schedule_spec_values():
    got = [optim.lr_cosine_schedule(t, 1.0, 0.1, 7, 21) for t in range(25)]
    assert got[0] == 0.0
    assert got[1] == pytest.approx(1 / 7)
    assert got[7] == pytest.approx(1.0)
    assert got[8] == pytest.approx(0.9887175604818206)
    assert got[14] == pytest.approx(0.55)
    assert all(v == pytest.approx(0.1) for v in got[21:])
    assert got == pytest.approx([ref_schedule(t, 1.0, 0.1, 7, 21) for t in range(25)])
    with pytest.raises(ValueError, match="it"):
        optim.lr_cosine_schedule(-1, 1.0, 0.1, 7, 21)


def test_clip_grad_norm_in_place():
    base = RNG.standard_normal(40).astype(np.float32)
    grads = [base[:10].reshape(2, 5), base[10:], RNG.standard_normal((3, 3)).astype(np.float32)]
    before = [g.astype(np.float64) for g in grads]
    norm = math.sqrt(sum(float((g * g).sum()) for g in before))
    got = optim.clip_grad_norm_(grads + [None], 1.0)
    assert got == pytest.approx(norm, rel=1e-6)
    for g, b in zip(grads, before):
        np.testing.assert_allclose(g, b * (1.0 / (norm + 1e-6)), rtol=1e-6)
    # The views wrote through to their base array.
    np.testing.assert_allclose(base[:10], grads[0].ravel())
    # Below the limit: unchanged; eps is used.
    small = [np.full(4, 0.1, dtype=np.float32)]
    assert optim.clip_grad_norm_(small, 1.0) == pytest.approx(0.2, rel=1e-6)
    assert (small[0] == np.float32(0.1)).all()
    big = [np.full(4, 10.0, dtype=np.float32)]
    optim.clip_grad_norm_(big, 1.0, eps=1.0)
    np.testing.assert_allclose(big[0], 10.0 * (1.0 / 21.0), rtol=1e-6)


def test_in_place_functions_reject_copies():
    with pytest.raises(ValueError, match="float32"):
        optim.clip_grad_norm_([np.ones(3)], 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        optim.clip_grad_norm_([np.ones((4, 4), dtype=np.float32)[:, ::2]], 1.0)
    frozen = np.ones(3, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="write"):
        optim.clip_grad_norm_([frozen], 1.0)
    with pytest.raises(ValueError, match="float32"):
        optim.clip_grad_norm_([[1.0, 2.0]], 1.0)


def ref_adamw(p, g, m, v, t, lr, b1, b2, eps, wd):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    alpha = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
    p = p - alpha * m / (np.sqrt(v) + eps)
    return p - lr * wd * p, m, v


def test_adamw_step_matches_reference():
    shape = (4, 6)
    p = RNG.standard_normal(shape).astype(np.float32)
    m = np.zeros(shape, dtype=np.float32)
    v = np.zeros(shape, dtype=np.float32)
    rp, rm, rv = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for t in range(1, 6):
        g = RNG.standard_normal(shape)
        grad = g.T.copy().T if t % 2 else g  # float64, sometimes non-contiguous
        optim.adamw_step(p, grad, m, v, t, **hp)
        rp, rm, rv = ref_adamw(rp, g.astype(np.float32).astype(np.float64), rm, rv, t,
                               hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"])
        np.testing.assert_allclose(p, rp, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m, rm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v, rv, rtol=1e-5, atol=1e-7)


def test_adamw_step_errors():
    p = np.zeros(4, dtype=np.float32)
    m, v = np.zeros(4, dtype=np.float32), np.zeros(4, dtype=np.float32)
    args = (1e-3, 0.9, 0.999, 1e-8, 0.0)
    with pytest.raises(ValueError, match="shape"):
        optim.adamw_step(p, np.zeros(5), m, v, 1, *args)
    with pytest.raises(ValueError, match="step"):
        optim.adamw_step(p, np.zeros(4), m, v, 0, *args)
    with pytest.raises(ValueError, match="float32"):
        optim.adamw_step(p.astype(np.float64), np.zeros(4), m, v, 1, *args)
    with pytest.raises(ValueError, match="shared|write"):
        optim.adamw_step(p, np.zeros(4), m, m, 1, *args)
