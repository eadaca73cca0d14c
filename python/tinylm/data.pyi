"""Random training batches of a 1-D token array, run in Rust."""

import numpy as np
import numpy.typing as npt

__all__ = ["get_batch"]

def get_batch(
    dataset: npt.ArrayLike,
    batch_size: int,
    context_length: int,
    seed: int | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``batch_size`` windows of the integer ``dataset`` (memory-mapped arrays are
    read in place): inputs ``dataset[s:s+T]`` and targets ``dataset[s+1:s+T+1]``,
    int64 ``(B, T)`` each, at starts uniform in ``[0, n - T)`` drawn with the
    training loop's SplitMix64 generator seeded with ``seed`` (random when None)."""
