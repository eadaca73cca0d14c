"""Layer functions of the CS336 Transformer LM (see ``nn.pyi`` for signatures).

Inputs may be any real dtype, layout and leading shape; outputs are new float32
arrays. All computation runs in Rust on the model's kernels.
"""

from tinylm._tinylm import nn as _nn

linear = _nn.linear
embedding = _nn.embedding
rmsnorm = _nn.rmsnorm
silu = _nn.silu
swiglu = _nn.swiglu
rope = _nn.rope
softmax = _nn.softmax
scaled_dot_product_attention = _nn.scaled_dot_product_attention
multihead_self_attention = _nn.multihead_self_attention
transformer_block = _nn.transformer_block
transformer_lm = _nn.transformer_lm
cross_entropy = _nn.cross_entropy

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
