"""Layer functions of the CS336 Transformer LM (see ``nn.pyi`` for signatures).

Inputs may be any real dtype, layout and leading shape; outputs are new float32
arrays. All computation runs in Rust on the model's kernels (``tinylm._tinylm.nn``);
the functions defined here first arrange their arguments with NumPy (broadcasting,
axis moves, the mask's dtype) into the fixed ranks the Rust ones take.
"""

import math

import numpy as np

from tinylm._tinylm import nn as _nn

__all__ = [
    "linear",
    "embedding",
    "rmsnorm",
    "silu",
    "swiglu",
    "rope",
    "softmax",
    "scaled_dot_product_attention",
    "multihead_self_attention",
    "transformer_block",
    "transformer_lm",
    "cross_entropy",
]


def _at_least(x, ndim, name):
    """``x`` as an array of at least ``ndim`` dimensions."""
    x = np.asarray(x)
    if x.ndim < ndim:
        raise ValueError(f"{name}: expected at least {ndim} dimensions, got shape {list(x.shape)}")
    return x


def _broadcast(x, shape, name):
    """``x`` broadcast to ``shape`` (a view), or a ``ValueError`` naming both shapes."""
    try:
        return np.broadcast_to(x, shape)
    except ValueError:
        raise ValueError(f"{name}: shape {list(np.shape(x))} does not broadcast to {list(shape)}") from None


def _merge(x, ndim):
    """``x`` with its leading dims merged into one: ``ndim`` dims in all."""
    split = x.ndim - ndim + 1
    return x.reshape(math.prod(x.shape[:split]), *x.shape[split:])


def rope(x, token_positions, theta, max_seq_len):
    """Rotary position embedding of ``x (..., seq, d_k)`` at ``token_positions``
    (broadcast to ``(..., seq)``)."""
    x = _at_least(x, 2, "x")
    positions = _broadcast(token_positions, x.shape[:-1], "token_positions")
    return _nn.rope(_merge(x, 2), positions.reshape(-1), theta, max_seq_len).reshape(x.shape)


def softmax(x, dim):
    """Softmax along ``dim`` (negative counts from the end), max subtracted first."""
    x = np.asarray(x)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim {dim} is out of range for an array of shape {list(x.shape)}")
    return np.ascontiguousarray(np.moveaxis(_nn.softmax(np.moveaxis(x, dim, -1)), -1, dim))


def scaled_dot_product_attention(q, k, v, mask=None):
    """``softmax(q @ k.T / sqrt(d_k)) @ v`` with the leading dims of ``q``, ``k``,
    ``v`` and the boolean ``mask`` broadcast (True = may attend)."""
    q, k, v = _at_least(q, 2, "q"), _at_least(k, 2, "k"), _at_least(v, 2, "v")
    (n, d_k), (m, d_v) = q.shape[-2:], v.shape[-2:]
    if k.shape[-2:] != (m, d_k):
        raise ValueError(
            f"shapes do not match: q {list(q.shape)} (…, n, d_k), k {list(k.shape)} (…, m, d_k), "
            f"v {list(v.shape)} (…, m, d_v)"
        )
    leads = [q.shape[:-2], k.shape[:-2], v.shape[:-2]]
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise ValueError(f"mask: expected a boolean array (True = attend), got dtype {mask.dtype}")
        leads.append(mask.shape[:-2])
    try:
        batch = np.broadcast_shapes(*leads)
    except ValueError:
        mask_shape = "" if mask is None else f", mask {list(mask.shape)}"
        raise ValueError(
            f"the batch dims of q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}{mask_shape} do not broadcast"
        ) from None

    def merged(x, rows, cols, name):
        return _merge(_broadcast(x, (*batch, rows, cols), name), 3)

    args = merged(q, n, d_k, "q"), merged(k, m, d_k, "k"), merged(v, m, d_v, "v")
    mask = None if mask is None else merged(mask, n, m, "mask")
    return _nn.scaled_dot_product_attention(*args, mask).reshape(*batch, n, d_v)


def multihead_self_attention(
    x, q_proj, k_proj, v_proj, o_proj, num_heads, theta=None, max_seq_len=None, token_positions=None
):
    """Causal multi-head self-attention of ``x (..., seq, d_in)``, with RoPE at
    ``token_positions`` (default ``0..seq``, broadcast to ``(..., seq)``) iff ``theta``."""
    x = _at_least(x, 2, "x")
    seq = x.shape[-2]
    rope = None
    if theta is not None:
        max_seq_len = seq if max_seq_len is None else max_seq_len
        if token_positions is None:
            if seq > max_seq_len:
                raise ValueError(f"sequence length {seq} exceeds max_seq_len {max_seq_len}")
            token_positions = np.arange(seq)
        positions = _broadcast(token_positions, x.shape[:-1], "token_positions")
        rope = theta, max_seq_len, positions.reshape(-1)
    out = _nn.multihead_self_attention(_merge(x, 3), q_proj, k_proj, v_proj, o_proj, num_heads, rope)
    return out.reshape(*x.shape[:-1], out.shape[-1])


# The rest of __all__ are the extension's functions as they are.
globals().update({name: getattr(_nn, name) for name in __all__ if name not in globals()})
