"""Learning-rate schedule, gradient clipping and AdamW (see ``optim.pyi``).

``clip_grad_norm_`` and ``adamw_step`` modify float32 C-contiguous arrays in place
(NumPy views of PyTorch tensors included) and raise ``ValueError`` for any other.
"""

from tinylm._tinylm import optim as _optim

lr_cosine_schedule = _optim.lr_cosine_schedule
clip_grad_norm_ = _optim.clip_grad_norm_
adamw_step = _optim.adamw_step

__all__ = ["lr_cosine_schedule", "clip_grad_norm_", "adamw_step"]
