"""Random training batches of a token array (see ``data.pyi``)."""

from tinylm._tinylm import data as _data

get_batch = _data.get_batch

__all__ = ["get_batch"]
