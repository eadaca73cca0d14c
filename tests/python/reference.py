"""NumPy float64 reference implementations of the CS336 layers, for the tests."""

import numpy as np

RNG = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return RNG.standard_normal(shape) * scale


def ref_linear(x, w):
    return x @ w.T


def ref_rmsnorm(x, g, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def ref_silu(x):
    return x / (1.0 + np.exp(-x))


def ref_swiglu(x, w1, w2, w3):
    return (ref_silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def ref_rope(x, positions, theta):
    d = x.shape[-1]
    k = np.arange(d // 2)
    angle = np.asarray(positions, dtype=np.float64)[..., None] / theta ** (2 * k / d)
    cos, sin = np.cos(angle), np.sin(angle)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty(np.broadcast_shapes(x.shape, cos.shape[:-1] + (d,)))
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def ref_softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def ref_sdpa(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    mask = np.broadcast_to(mask, scores.shape)
    scores = np.where(mask, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(mask, np.exp(scores - top), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return p @ v


def ref_mha(x, wq, wk, wv, wo, heads, theta=None, positions=None):
    *lead, t, _ = x.shape
    c = wq.shape[0]
    d = c // heads

    def split(y):  # (..., t, c) -> (..., heads, t, d)
        return np.swapaxes(y.reshape(*lead, t, heads, d), -2, -3)

    q, k, v = split(x @ wq.T), split(x @ wk.T), split(x @ wv.T)
    if theta is not None:
        pos = np.arange(t) if positions is None else np.asarray(positions)
        pos = pos[..., None, :]  # broadcast over heads
        q, k = ref_rope(q, pos, theta), ref_rope(k, pos, theta)
    causal = np.tril(np.ones((t, t), dtype=bool))
    out = ref_sdpa(q, k, v, causal)
    out = np.swapaxes(out, -2, -3).reshape(*lead, t, c)
    return out @ wo.T


def ref_block(x, w, heads, theta):
    h = ref_rmsnorm(x, w["ln1.weight"])
    y = x + ref_mha(
        h,
        w["attn.q_proj.weight"],
        w["attn.k_proj.weight"],
        w["attn.v_proj.weight"],
        w["attn.output_proj.weight"],
        heads,
        theta,
    )
    h = ref_rmsnorm(y, w["ln2.weight"])
    return y + ref_swiglu(h, w["ffn.w1.weight"], w["ffn.w2.weight"], w["ffn.w3.weight"])


def ref_lm(ids, w, num_layers, heads, theta):
    x = w["token_embeddings.weight"][ids]
    for i in range(num_layers):
        prefix = f"layers.{i}."
        layer = {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}
        x = ref_block(x, layer, heads, theta)
    return ref_rmsnorm(x, w["ln_final.weight"]) @ w["lm_head.weight"].T


def ref_cross_entropy(logits, targets):
    top = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return float(np.mean(lse - picked))


def block_weights(c, f, scale=0.3):
    return {
        "attn.q_proj.weight": randn(c, c, scale=scale),
        "attn.k_proj.weight": randn(c, c, scale=scale),
        "attn.v_proj.weight": randn(c, c, scale=scale),
        "attn.output_proj.weight": randn(c, c, scale=scale),
        "ln1.weight": 1 + randn(c, scale=0.1),
        "ln2.weight": 1 + randn(c, scale=0.1),
        "ffn.w1.weight": randn(f, c, scale=scale),
        "ffn.w2.weight": randn(c, f, scale=scale),
        "ffn.w3.weight": randn(f, c, scale=scale),
    }


def lm_weights(vocab, c, f, layers):
    w = {"token_embeddings.weight": randn(vocab, c)}
    for i in range(layers):
        w.update({f"layers.{i}.{k}": v for k, v in block_weights(c, f).items()})
    w["ln_final.weight"] = 1 + randn(c, scale=0.1)
    w["lm_head.weight"] = randn(vocab, c, scale=0.3)
    return w
