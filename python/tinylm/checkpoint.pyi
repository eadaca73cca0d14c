"""Checkpoints: model and optimizer state dicts, the iteration and string metadata
in one safetensors file (optimizer tensors under the prefix ``optim.``)."""

import os
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

__all__ = ["save", "load"]

def save(
    path_or_binary_file: str | os.PathLike[str] | BinaryIO,
    model_state: dict[str, npt.ArrayLike],
    optimizer_state: dict[str, npt.ArrayLike],
    iteration: int,
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes the state dicts (stored as float32), ``iteration`` and ``metadata`` to a
    path (through a temporary file and a rename) or a binary file object."""

def load(
    path_or_binary_file: str | os.PathLike[str] | BinaryIO,
) -> tuple[dict[str, npt.NDArray[np.float32]], dict[str, npt.NDArray[np.float32]], int, dict[str, str]]:
    """Reads ``(model_state, optimizer_state, iteration, metadata)``; also reads the
    training loop's checkpoints (their moments as ``m.<name>``/``v.<name>``)."""
