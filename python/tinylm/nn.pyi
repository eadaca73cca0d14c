"""Layer functions of the CS336 Transformer LM, run in Rust on the model's kernels.

Float inputs may have any real dtype, memory layout and number of leading
dimensions; they are read as float32. Every function returns a new float32 array.
Bad shapes or values raise ``ValueError``.
"""

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

Array = npt.ArrayLike
F32 = npt.NDArray[np.float32]

def linear(x: Array, weight: Array) -> F32:
    """``x @ weight.T``: ``x (..., d_in)``, ``weight (d_out, d_in)`` -> ``(..., d_out)``."""

def embedding(token_ids: Array, weight: Array) -> F32:
    """Rows of ``weight (vocab_size, d)`` at ``token_ids`` (any integer dtype and
    shape ``S``) -> ``(*S, d)``. An id outside ``[0, vocab_size)`` is an error."""

def rmsnorm(x: Array, weight: Array, eps: float = 1e-5) -> F32:
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``,
    ``weight (d,)``."""

def silu(x: Array) -> F32:
    """``x * sigmoid(x)`` elementwise."""

def swiglu(x: Array, w1: Array, w2: Array, w3: Array) -> F32:
    """The SwiGLU feed-forward network ``w2 (silu(w1 x) * w3 x)``: ``x (..., d_model)``,
    ``w1``, ``w3 (d_ff, d_model)``, ``w2 (d_model, d_ff)``."""

def rope(x: Array, token_positions: Array, theta: float, max_seq_len: int) -> F32:
    """Rotary position embedding of ``x (..., seq, d_k)`` at integer
    ``token_positions (..., seq)`` (broadcast against ``x``'s leading dims; each below
    ``max_seq_len``): the pair ``(x[2k], x[2k+1])`` is rotated by
    ``pos / theta**(2k/d_k)``."""

def softmax(x: Array, dim: int) -> F32:
    """Softmax along ``dim`` (negative counts from the end), max subtracted first."""

def scaled_dot_product_attention(q: Array, k: Array, v: Array, mask: Array | None = None) -> F32:
    """``softmax(q @ k.T / sqrt(d_k)) @ v`` with ``q (..., n, d_k)``, ``k (..., m, d_k)``,
    ``v (..., m, d_v)`` (leading dims broadcast) -> ``(..., n, d_v)``. ``mask`` is a
    boolean array broadcastable to ``(..., n, m)``, True = may attend; masked
    probabilities are exactly 0 and a query whose keys are all masked gets zeros."""

def multihead_self_attention(
    x: Array,
    q_proj: Array,
    k_proj: Array,
    v_proj: Array,
    o_proj: Array,
    num_heads: int,
    theta: float | None = None,
    max_seq_len: int | None = None,
    token_positions: Array | None = None,
) -> F32:
    """Causal multi-head self-attention of ``x (..., seq, d_in)``: projections
    ``(d_model, d_in)`` and ``o_proj (d_model, d_model)``, head ``h`` owning rows
    ``h*d_k:(h+1)*d_k``. RoPE on queries and keys iff ``theta`` is given, at
    ``token_positions`` (default ``0..seq``) with tables for ``max_seq_len``
    positions (default ``seq``)."""

def transformer_block(
    x: Array,
    weights: Mapping[str, Array],
    num_heads: int,
    d_ff: int,
    theta: float,
    max_seq_len: int,
) -> F32:
    """A pre-norm block on ``x (..., seq, d_model)``: ``y = x + MHA(RMSNorm1(x))``,
    ``z = y + SwiGLU(RMSNorm2(y))`` with RoPE at ``0..seq``. ``weights`` keys:
    ``attn.{q,k,v,output}_proj.weight``, ``ln1.weight``, ``ln2.weight``,
    ``ffn.w1.weight``, ``ffn.w2.weight``, ``ffn.w3.weight``."""

def transformer_lm(
    token_ids: Array,
    weights: Mapping[str, Array],
    vocab_size: int,
    context_length: int,
    d_model: int,
    num_layers: int,
    num_heads: int,
    d_ff: int,
    rope_theta: float,
) -> F32:
    """Logits ``(..., seq, vocab_size)`` of the Transformer LM for ``token_ids
    (..., seq)``, ``seq <= context_length``. ``weights`` is the full CS336 state dict
    (``token_embeddings.weight``, ``layers.{i}.…``, ``ln_final.weight``,
    ``lm_head.weight``), exactly those tensors with their shapes."""

def cross_entropy(logits: Array, targets: Array) -> float:
    """Mean over every leading position of ``logsumexp(logits) - logits[target]``:
    ``logits (..., vocab_size)``, integer ``targets (...)``. Stable for large logits."""
