"""Learning-rate schedule, gradient clipping and AdamW, run in Rust.

``clip_grad_norm_`` and ``adamw_step`` modify float32 C-contiguous writeable arrays
in place (NumPy views of PyTorch tensors included, no copies) and raise
``ValueError`` for any other array.
"""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["lr_cosine_schedule", "clip_grad_norm_", "adamw_step"]

def lr_cosine_schedule(
    it: int,
    max_learning_rate: float,
    min_learning_rate: float,
    warmup_iters: int,
    cosine_cycle_iters: int,
) -> float:
    """The learning rate at iteration ``it``: ``max * it / warmup`` during warm-up,
    ``min + (1 + cos(pi (it - warmup) / (cycle - warmup))) (max - min) / 2`` up to
    ``cosine_cycle_iters``, then ``min``."""

def clip_grad_norm_(
    grads: Sequence[npt.NDArray[np.float32] | None],
    max_l2_norm: float,
    eps: float = 1e-6,
) -> float:
    """Scales every gradient in place by ``max_l2_norm / (norm + eps)`` when their
    global L2 norm exceeds ``max_l2_norm``; returns the norm before clipping.
    ``None`` entries are skipped."""

def adamw_step(
    param: npt.NDArray[np.float32],
    grad: npt.ArrayLike,
    exp_avg: npt.NDArray[np.float32],
    exp_avg_sq: npt.NDArray[np.float32],
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW step (``step`` counts from 1), in place on ``param``, ``exp_avg`` and
    ``exp_avg_sq`` (all of ``grad``'s shape): ``m = b1 m + (1-b1) g``,
    ``v = b2 v + (1-b2) g**2``, ``p -= lr sqrt(1-b2**t)/(1-b1**t) m/(sqrt(v)+eps)``,
    then ``p -= lr weight_decay p``."""
