"""Layer functions of the CS336 Transformer LM, run in Rust on the model's kernels.

Float inputs may have any real dtype, memory layout and number of leading
dimensions; they are read as float32. Every function returns a new float32 array.
Bad shapes or values raise ``ValueError``.
"""

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

_Array = npt.ArrayLike
_F32 = npt.NDArray[np.float32]

__all__ = ["linear", "embedding", "rmsnorm", "silu", "swiglu", "rope", "softmax", "scaled_dot_product_attention", "multihead_self_attention", "transformer_block", "transformer_lm", "cross_entropy"]

def linear(x: _Array, weight: _Array) -> _F32:
    """``x @ weight.T``: ``x (..., d_in)``, ``weight (d_out, d_in)`` -> ``(..., d_out)``."""

def embedding(token_ids: _Array, weight: _Array) -> _F32:
    """Rows of ``weight (vocab_size, d)`` at ``token_ids`` (any integer dtype and
    shape ``S``) -> ``(*S, d)``. An id outside ``[0, vocab_size)`` is an error."""

def rmsnorm(x: _Array, weight: _Array, eps: float = 1e-5) -> _F32:
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``,
    ``weight (d,)``."""

def silu(x: _Array) -> _F32:
    """``x * sigmoid(x)`` elementwise."""

def swiglu(x: _Array, w1: _Array, w2: _Array, w3: _Array) -> _F32:
    """The SwiGLU feed-forward network ``w2 (silu(w1 x) * w3 x)``: ``x (..., d_model)``,
    ``w1``, ``w3 (d_ff, d_model)``, ``w2 (d_model, d_ff)``."""

def rope(x: _Array, token_positions: _Array, theta: float, max_seq_len: int) -> _F32:
    """Rotary position embedding of ``x (..., seq, d_k)`` at integer
    ``token_positions (..., seq)`` (broadcast against ``x``'s leading dims; each below
    ``max_seq_len``): the pair ``(x[2k], x[2k+1])`` is rotated by
    ``pos / theta**(2k/d_k)``."""

def softmax(x: _Array, dim: int) -> _F32:
    """Softmax along ``dim`` (negative counts from the end), max subtracted first."""

def scaled_dot_product_attention(q: _Array, k: _Array, v: _Array, mask: _Array | None = None) -> _F32:
    """``softmax(q @ k.T / sqrt(d_k)) @ v`` with ``q (..., n, d_k)``, ``k (..., m, d_k)``,
    ``v (..., m, d_v)`` (leading dims broadcast) -> ``(..., n, d_v)``. ``mask`` is a
    boolean array broadcastable to ``(..., n, m)``, True = may attend; masked
    probabilities are exactly 0 and a query whose keys are all masked gets zeros."""

def multihead_self_attention(
    x: _Array,
    q_proj: _Array,
    k_proj: _Array,
    v_proj: _Array,
    o_proj: _Array,
    num_heads: int,
    theta: float | None = None,
    max_seq_len: int | None = None,
    token_positions: _Array | None = None,
) -> _F32:
    """Causal multi-head self-attention of ``x (..., seq, d_in)``: projections
    ``(d_model, d_in)`` and ``o_proj (d_model, d_model)``, head ``h`` owning rows
    ``h*d_k:(h+1)*d_k``. RoPE on queries and keys iff ``theta`` is given, at
    ``token_positions`` (default ``0..seq``) with tables for ``max_seq_len``
    positions (default ``seq``)."""

def transformer_block(
    x: _Array,
    weights: Mapping[str, _Array],
    num_heads: int,
    d_ff: int,
    theta: float,
    max_seq_len: int,
) -> _F32:
    """A pre-norm block on ``x (..., seq, d_model)``: ``y = x + MHA(RMSNorm1(x))``,
    ``z = y + SwiGLU(RMSNorm2(y))`` with RoPE at ``0..seq``. ``weights`` keys:
    ``attn.{q,k,v,output}_proj.weight``, ``ln1.weight``, ``ln2.weight``,
    ``ffn.w1.weight``, ``ffn.w2.weight``, ``ffn.w3.weight``."""

def transformer_lm(
    token_ids: _Array,
    weights: Mapping[str, _Array],
    vocab_size: int,
    context_length: int,
    d_model: int,
    num_layers: int,
    num_heads: int,
    d_ff: int,
    rope_theta: float,
) -> _F32:
    """Logits ``(..., seq, vocab_size)`` of the Transformer LM for ``token_ids
    (..., seq)``, ``seq <= context_length``. ``weights`` is the full CS336 state dict
    (``token_embeddings.weight``, ``layers.{i}.…``, ``ln_final.weight``,
    ``lm_head.weight``), exactly those tensors with their shapes."""

def cross_entropy(logits: _Array, targets: _Array) -> float:
    """Mean over every leading position of ``logsumexp(logits) - logits[target]``:
    ``logits (..., vocab_size)``, integer ``targets (...)``. Stable for large logits."""
