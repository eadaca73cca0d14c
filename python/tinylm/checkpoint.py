"""Checkpoints: state dicts, iteration and metadata in one safetensors file
(see ``checkpoint.pyi``)."""

from tinylm._tinylm import checkpoint as _checkpoint

save = _checkpoint.save
load = _checkpoint.load

__all__ = ["save", "load"]
