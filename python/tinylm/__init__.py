"""tinylm: train a language model from scratch — byte-level BPE, a Transformer LM,
its training loop and generation — with the interfaces of Stanford CS336 assignment 1.

Everything runs in Rust (the ``tinylm._tinylm`` extension); this package only
re-exports it:

- ``tinylm.train_bpe``, ``tinylm.Tokenizer``, ``tinylm.pretokenize``: the tokenizer;
- ``tinylm.nn``: the layer functions (NumPy in, float32 NumPy out);
- ``tinylm.optim``, ``tinylm.data``, ``tinylm.checkpoint``: training pieces;
- ``tinylm.TransformerLM``, ``tinylm.train``: the model and the training loop
  (``tinylm.preset_config``: a named model's configuration);
- ``tinylm.sweep``, ``tinylm.plot``: many runs, and their losses on one plot;
- ``tinylm.tinystories``: the TinyStories sample inside tinylm, a corpus to start with.
"""

from tinylm import checkpoint, data, nn, optim
from tinylm._tinylm import (
    Tokenizer,
    TransformerLM,
    __version__,
    plot,
    preset_config,
    pretokenize,
    sweep,
    tinystories,
    train,
    train_bpe,
)

__all__ = [
    "Tokenizer",
    "TransformerLM",
    "__version__",
    "checkpoint",
    "data",
    "nn",
    "optim",
    "plot",
    "preset_config",
    "pretokenize",
    "sweep",
    "tinystories",
    "train",
    "train_bpe",
]
