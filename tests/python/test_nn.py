"""tinylm.nn against NumPy float64 reference implementations written here."""

import numpy as np
import pytest

from reference import (
    RNG,
    block_weights,
    lm_weights,
    randn,
    ref_block,
    ref_cross_entropy,
    ref_linear,
    ref_lm,
    ref_mha,
    ref_rmsnorm,
    ref_rope,
    ref_sdpa,
    ref_silu,
    ref_softmax,
    ref_swiglu,
)
from tinylm import nn


def close(actual, expected, atol=2e-5, rtol=2e-5):
    assert actual.dtype == np.float32
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=rtol)


# --- tests --------------------------------------------------------------------


def test_linear_batch_dims_dtypes_and_layouts():
    x, w = randn(2, 3, 5, 8), randn(6, 8)
    close(nn.linear(x, w), ref_linear(x, w))
    close(nn.linear(x.astype(np.float32), w.astype(np.float16)), ref_linear(x, w.astype(np.float16)), atol=1e-4)
    xt = randn(8, 5).T  # non-contiguous (5, 8)
    wt = randn(8, 6).T
    close(nn.linear(xt, wt), ref_linear(xt, wt))
    x1 = randn(16, 8)[::2]  # strided rows
    close(nn.linear(x1, w), ref_linear(x1, w))
    x1d = randn(8)
    close(nn.linear(x1d, w), ref_linear(x1d, w))


def test_linear_errors():
    with pytest.raises(ValueError, match="features"):
        nn.linear(randn(3, 5), randn(4, 6))
    with pytest.raises(ValueError, match="dimensions"):
        nn.linear(randn(3, 5), randn(5))
    with pytest.raises(ValueError, match="real-valued"):
        nn.linear(np.ones((2, 2), dtype=complex), randn(2, 2))


def test_embedding_any_integer_dtype():
    w = randn(10, 4)
    for dtype in (np.int64, np.int32, np.uint16, np.uint8):
        ids = RNG.integers(0, 10, size=(2, 3, 5)).astype(dtype)
        close(nn.embedding(ids, w), w[ids.astype(np.int64)])
    ids = RNG.integers(0, 10, size=(6, 4)).T  # non-contiguous
    close(nn.embedding(ids, w), w[ids])
    with pytest.raises(ValueError, match="outside"):
        nn.embedding(np.array([1, 10]), w)
    with pytest.raises(ValueError, match="outside"):
        nn.embedding(np.array([-1]), w)
    with pytest.raises(ValueError, match="integer"):
        nn.embedding(np.array([1.0]), w)


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-2])
def test_rmsnorm(eps):
    x, g = randn(2, 3, 16), randn(16)
    close(nn.rmsnorm(x, g, eps), ref_rmsnorm(x, g, eps))
    xt = randn(16, 7).T
    close(nn.rmsnorm(xt, g, eps=eps), ref_rmsnorm(xt, g, eps))
    small = randn(4, 16, scale=1e-3)
    close(nn.rmsnorm(small, g, eps), ref_rmsnorm(small, g, eps), atol=1e-4, rtol=1e-4)


def test_rmsnorm_errors():
    with pytest.raises(ValueError, match="shape"):
        nn.rmsnorm(randn(2, 8), randn(7))
    with pytest.raises(ValueError, match="eps"):
        nn.rmsnorm(randn(2, 8), randn(8), 0.0)


def test_silu_and_swiglu():
    x = randn(3, 4, 5, scale=4)
    close(nn.silu(x), ref_silu(x))
    close(nn.silu(x.transpose(2, 0, 1)), ref_silu(x.transpose(2, 0, 1)))
    c, f = 8, 24
    x = randn(2, 3, c)
    w1, w2, w3 = randn(f, c, scale=0.3), randn(c, f, scale=0.3), randn(f, c, scale=0.3)
    close(nn.swiglu(x, w1, w2, w3), ref_swiglu(x, w1, w2, w3), atol=1e-4)
    close(nn.swiglu(x[:, ::-1], w1, w2, w3), ref_swiglu(x[:, ::-1], w1, w2, w3), atol=1e-4)
    with pytest.raises(ValueError, match="w2"):
        nn.swiglu(x, w1, w1, w3)


def test_rope_positions_broadcast():
    theta, max_seq_len = 10000.0, 64
    x = randn(2, 3, 7, 16)
    pos = np.arange(7)
    close(nn.rope(x, pos, theta, max_seq_len), ref_rope(x, pos, theta), atol=1e-5)
    arbitrary = RNG.integers(0, max_seq_len, size=(2, 1, 7))  # broadcast over dim 1
    close(nn.rope(x, arbitrary, theta, max_seq_len), ref_rope(x, arbitrary, theta), atol=1e-5)
    xt = np.swapaxes(randn(2, 16, 7), -1, -2)  # non-contiguous
    close(nn.rope(xt, pos, 500.0, 16), ref_rope(xt, pos, 500.0), atol=1e-5)


def test_rope_errors():
    with pytest.raises(ValueError, match="outside"):
        nn.rope(randn(4, 8), np.array([0, 1, 2, 9]), 10000.0, 8)
    with pytest.raises(ValueError, match="even"):
        nn.rope(randn(4, 7), np.arange(4), 10000.0, 8)
    with pytest.raises(ValueError, match="broadcast"):
        nn.rope(randn(4, 8), np.arange(5), 10000.0, 8)


def test_softmax_any_dim():
    x = randn(3, 4, 5, scale=10)
    for dim in (0, 1, 2, -1, -3):
        close(nn.softmax(x, dim), ref_softmax(x, dim))
    big = x * 1000  # would overflow without the max subtracted
    out = nn.softmax(big, -1)
    assert np.isfinite(out).all()
    close(out, ref_softmax(big, -1), atol=1e-6)
    close(nn.softmax(x.T, 1), ref_softmax(x.T, 1))
    with pytest.raises(ValueError, match="dim"):
        nn.softmax(x, 3)


def test_sdpa_masks_batch_dims_and_n_ne_m():
    q, k, v = randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5)
    close(nn.scaled_dot_product_attention(q, k, v), ref_sdpa(q, k, v))
    mask = RNG.random((4, 6)) > 0.4
    mask[1] = False  # a fully masked query row
    out = nn.scaled_dot_product_attention(q, k, v, mask)
    assert not np.isnan(out).any()
    assert (out[:, :, 1] == 0).all()
    close(out, ref_sdpa(q, k, v, mask))
    batch_mask = RNG.random((3, 4, 6)) > 0.5  # broadcast over the first dim
    close(nn.scaled_dot_product_attention(q, k, v, batch_mask), ref_sdpa(q, k, v, batch_mask))
    # Non-contiguous inputs and a broadcast batch dim of k, v.
    qt = np.swapaxes(randn(2, 3, 8, 4), -1, -2)
    k1, v1 = randn(1, 3, 6, 8), randn(3, 6, 5)
    close(nn.scaled_dot_product_attention(qt, k1, v1, mask), ref_sdpa(qt, k1, v1, mask))
    all_masked = np.zeros((4, 6), dtype=bool)
    assert (nn.scaled_dot_product_attention(q, k, v, all_masked) == 0).all()


def test_sdpa_errors():
    q, k, v = randn(4, 8), randn(6, 8), randn(6, 5)
    with pytest.raises(ValueError, match="do not match"):
        nn.scaled_dot_product_attention(q, randn(6, 7), v)
    with pytest.raises(ValueError, match="do not match"):
        nn.scaled_dot_product_attention(q, k, randn(5, 5))
    with pytest.raises(ValueError, match="boolean"):
        nn.scaled_dot_product_attention(q, k, v, np.ones((4, 6)))
    with pytest.raises(ValueError, match="broadcast"):
        nn.scaled_dot_product_attention(q, k, v, np.ones((4, 5), dtype=bool))
    with pytest.raises(ValueError, match="broadcast"):
        nn.scaled_dot_product_attention(randn(2, 4, 8), randn(3, 6, 8), randn(3, 6, 5))


def test_multihead_self_attention():
    c, heads, t = 16, 4, 6
    x = randn(2, 3, t, c)
    wq, wk, wv, wo = (randn(c, c, scale=0.3) for _ in range(4))
    close(nn.multihead_self_attention(x, wq, wk, wv, wo, heads), ref_mha(x, wq, wk, wv, wo, heads), atol=1e-4)
    close(
        nn.multihead_self_attention(x, wq, wk, wv, wo, heads, theta=10000.0, max_seq_len=16),
        ref_mha(x, wq, wk, wv, wo, heads, 10000.0),
        atol=1e-4,
    )
    pos = RNG.integers(0, 32, size=(t,))
    close(
        nn.multihead_self_attention(x, wq, wk, wv, wo, heads, 10000.0, 32, pos),
        ref_mha(x, wq, wk, wv, wo, heads, 10000.0, pos),
        atol=1e-4,
    )
    # d_in != d_model and a non-contiguous input.
    xin = np.swapaxes(randn(2, 12, t), -1, -2)
    wq2, wk2, wv2 = (randn(c, 12, scale=0.3) for _ in range(3))
    close(
        nn.multihead_self_attention(xin, wq2, wk2, wv2, wo, heads),
        ref_mha(xin, wq2, wk2, wv2, wo, heads),
        atol=1e-4,
    )
    with pytest.raises(ValueError, match="divisible"):
        nn.multihead_self_attention(x, wq, wk, wv, wo, 3)
    with pytest.raises(ValueError, match="shape"):
        nn.multihead_self_attention(x, wq, wk[:8], wv, wo, heads)


def test_transformer_block():
    c, f, heads, t = 16, 40, 2, 5
    w = block_weights(c, f)
    x = randn(3, t, c)
    close(nn.transformer_block(x, w, heads, f, 10000.0, 8), ref_block(x, w, heads, 10000.0), atol=2e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="missing"):
        nn.transformer_block(x, {k: v for k, v in w.items() if k != "ln2.weight"}, heads, f, 10000.0, 8)
    with pytest.raises(ValueError, match="ffn.w1.weight"):
        nn.transformer_block(x, w, heads, f + 1, 10000.0, 8)


def test_transformer_lm():
    vocab, ctx, c, layers, heads, f = 50, 16, 16, 2, 4, 32
    w = lm_weights(vocab, c, f, layers)
    ids = RNG.integers(0, vocab, size=(3, 7))
    out = nn.transformer_lm(ids, w, vocab, ctx, c, layers, heads, f, 10000.0)
    close(out, ref_lm(ids, w, layers, heads, 10000.0), atol=5e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="missing 'ln_final.weight'"):
        nn.transformer_lm(ids, {k: v for k, v in w.items() if k != "ln_final.weight"}, vocab, ctx, c, layers, heads, f, 1e4)
    with pytest.raises(ValueError, match="context_length|sequence"):
        nn.transformer_lm(RNG.integers(0, vocab, size=(1, 17)), w, vocab, ctx, c, layers, heads, f, 1e4)
    with pytest.raises(ValueError, match="outside"):
        nn.transformer_lm(np.array([[vocab]]), w, vocab, ctx, c, layers, heads, f, 1e4)


def test_cross_entropy():
    logits = randn(2, 3, 11, scale=3)
    targets = RNG.integers(0, 11, size=(2, 3))
    assert nn.cross_entropy(logits, targets) == pytest.approx(ref_cross_entropy(logits, targets), rel=1e-5)
    big = logits * 1000
    got = nn.cross_entropy(big, targets)
    assert np.isfinite(got)
    assert got == pytest.approx(ref_cross_entropy(big, targets), rel=1e-5)
    lt = np.swapaxes(randn(11, 4), 0, 1)
    t4 = RNG.integers(0, 11, size=4)
    assert nn.cross_entropy(lt, t4) == pytest.approx(ref_cross_entropy(lt, t4), rel=1e-5)
    with pytest.raises(ValueError, match="do not match"):
        nn.cross_entropy(logits, targets[:, :2])
    with pytest.raises(ValueError, match="outside"):
        nn.cross_entropy(logits, np.full((2, 3), 11))
