"""Type stubs of the Rust extension module ``tinylm._tinylm``."""

import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
__all__ = [
    "__version__",
    "train_bpe",
    "pretokenize",
    "tinystories",
    "Tokenizer",
    "EncodeIterable",
    "TransformerLM",
    "preset_config",
    "train",
    "sweep",
    "plot",
    "nn",
    "optim",
    "data",
    "checkpoint",
]

def train_bpe(
    input_path: str | os.PathLike[str],
    vocab_size: int,
    special_tokens: list[str] | None = None,
    pattern: str = "gpt2",
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Trains a byte-level BPE tokenizer on a UTF-8 text file (CS336 semantics).

    The vocabulary is the 256 bytes, then the special tokens, then one token per
    merge, ``vocab_size`` tokens in all. Ties between equally frequent pairs go to
    the lexicographically greater pair. ``pattern`` is the split pattern: ``"gpt2"``
    (CS336's), ``"gpt4"`` (cl100k), ``"o200k"`` or a regex. Runs on all cores
    without the GIL. Raises ``FileNotFoundError``/``OSError`` for the file,
    ``ValueError`` for invalid UTF-8, a bad regex or a ``vocab_size`` below
    ``256 + len(special_tokens)``.
    """

def pretokenize(text: str, pattern: str = "gpt2") -> list[str]:
    """The pre-tokens of ``text`` under ``pattern`` (``"gpt2"``, ``"gpt4"``,
    ``"o200k"`` or a regex), as tiktoken's regex splits it; no special tokens."""

def tinystories() -> str:
    """The TinyStories sample inside tinylm (5,808 stories, 4.9 MB,
    CDLA-Sharing-1.0), each story followed by a line ``<|endoftext|>``."""

@final
class Tokenizer:
    """A byte-level BPE tokenizer: vocabulary, merges, special tokens and split
    pattern.

    ``vocab`` maps ids ``0..len(vocab)`` to bytes; ``merges`` lists the merges in
    order of creation. Special tokens absent from ``vocab`` are appended to it;
    in text they always become their single id (longest match first). ``pattern``
    is ``"gpt2"`` (the default, CS336's), ``"gpt4"`` (cl100k), ``"o200k"`` or a regex.
    """

    def __new__(
        cls,
        vocab: dict[int, bytes],
        merges: list[tuple[bytes, bytes]],
        special_tokens: list[str] | None = None,
        pattern: str = "gpt2",
    ) -> "Tokenizer": ...
    @classmethod
    def from_files(
        cls,
        vocab_filepath: str | os.PathLike[str],
        merges_filepath: str | os.PathLike[str],
        special_tokens: list[str] | None = None,
        pattern: str = "gpt2",
    ) -> "Tokenizer":
        """Reads a GPT-2 style ``vocab.json`` and ``merges.txt``."""
    @classmethod
    def load(cls, dir: str | os.PathLike[str]) -> "Tokenizer":
        """Reads a tokenizer directory: ``tokenizer.json`` when it has one (with its
        split pattern), else ``vocab.json`` and ``merges.txt`` (GPT-2's pattern)."""
    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        """Reads a Hugging Face ``tokenizer.json`` (byte-level BPE)."""
    @classmethod
    def from_tiktoken(
        cls,
        path: str | os.PathLike[str],
        pattern: str,
        special_tokens: dict[str, int] | list[str] | None = None,
    ) -> "Tokenizer":
        """Reads a tiktoken rank file made for ``pattern``; ``special_tokens`` maps
        each special token to its id (a list gives them the ids after the last rank)."""
    @classmethod
    def train(
        cls,
        files: Sequence[str | os.PathLike[str]],
        vocab_size: int,
        special_tokens: list[str] | None = None,
        pattern: str = "gpt2",
    ) -> "Tokenizer":
        """Trains on text files, each a document of its own (CS336 semantics)."""
    @classmethod
    def train_from_iterator(
        cls,
        iterator: Iterable[str],
        vocab_size: int,
        special_tokens: list[str] | None = None,
        pattern: str = "gpt2",
    ) -> "Tokenizer":
        """Trains on the strings of ``iterator``, each a document of its own, pulled
        in batches of about 8 MB and counted on all cores: memory follows the unique
        pre-tokens, not the text. Errors raised by the iterator propagate."""
    def save(self, dir: str | os.PathLike[str]) -> None:
        """Writes ``vocab.json``, ``merges.txt`` and ``tokenizer.json`` into ``dir``."""
    def to_tokenizer_json(self, path: str | os.PathLike[str]) -> None:
        """Writes the Hugging Face ``tokenizer.json``."""
    def to_tiktoken(self, path: str | os.PathLike[str], name: str = "tinylm") -> Any:
        """Writes the tiktoken rank file and returns the ``tiktoken.Encoding`` with
        the same ids, split pattern and special tokens (needs ``tiktoken``)."""
    @property
    def pattern(self) -> str:
        """The split pattern's name: ``gpt2``, ``gpt4``, ``o200k`` or ``custom``."""
    @property
    def pattern_regex(self) -> str:
        """The split pattern's regex (tiktoken's ``pat_str``)."""
    @property
    def special_tokens(self) -> list[str]:
        """The special tokens."""
    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merges in rank order."""
    @property
    def vocab_size(self) -> int:
        """Number of tokens, special tokens included."""
    @property
    def vocab(self) -> dict[int, bytes]:
        """The vocabulary ``{id: bytes}``, special tokens included."""
    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (runs without the GIL)."""
    def encode_batch(self, texts: list[str], num_threads: int | None = None) -> list[list[int]]:
        """The ids of each text, encoded in parallel (default: all cores)."""
    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of the concatenation of the strings of ``iterable`` (e.g. a text
        file's lines), lazily: memory stays bounded whatever the input's size, and
        the ids equal ``encode("".join(iterable))``. (With a custom regex, text is
        held back up to the next special token.)"""
    def decode(self, ids: Sequence[int] | npt.ArrayLike) -> str:
        """The text of ``ids``; malformed UTF-8 becomes U+FFFD. An id out of range
        raises ``ValueError``."""

@final
class EncodeIterable(Iterator[int]):
    """The lazy iterator returned by ``Tokenizer.encode_iterable``."""

    def __iter__(self) -> "EncodeIterable": ...
    def __next__(self) -> int: ...

@final
class TransformerLM:
    """A decoder-only Transformer LM run in Rust. ``config`` has the engine's keys:
    ``vocab_size``, ``context_length``, ``d_model``, ``num_layers``, ``num_heads``,
    ``d_ff``, ``rope_theta`` and the ablations ``norm`` (pre/post/none),
    ``positional`` (rope/none), ``ffn`` (swiglu/silu), ``tie_embeddings``.
    Weights are initialized as the SPEC says from ``seed``. ``device`` is ``cpu``,
    ``cuda``, ``cuda:N`` or ``auto`` (CUDA needs a build with the cargo feature
    ``cuda``); ``precision`` is ``auto`` (bf16 where the CPU or GPU multiplies bf16
    natively), ``bf16`` (bf16 products summed in f32) or ``fp32``; by default fp32 on
    the CPU and auto on a GPU."""

    def __new__(
        cls,
        config: dict[str, Any],
        seed: int = 0,
        device: str = "cpu",
        precision: str | None = None,
    ) -> "TransformerLM": ...
    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], device: str = "cpu", precision: str | None = None
    ) -> "TransformerLM":
        """A model from a checkpoint file or a run directory, on ``device``."""
    @property
    def config(self) -> dict[str, Any]:
        """The configuration."""
    def load_state_dict(self, state: dict[str, npt.ArrayLike]) -> None:
        """Replaces every parameter; ``state`` holds exactly the model's tensors."""
    def state_dict(self) -> dict[str, npt.NDArray[np.float32]]:
        """Copies of the parameters by CS336 name."""
    def forward(self, ids: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Logits ``(..., T, vocab_size)`` for integer ids ``(..., T)``."""
    def __call__(self, ids: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Same as ``forward``."""
    def loss_and_grads(
        self, ids: npt.ArrayLike, targets: npt.ArrayLike
    ) -> tuple[float, dict[str, npt.NDArray[np.float32]]]:
        """Mean cross-entropy of predicting ``targets`` from ``ids`` (same shape) and
        its gradient for every parameter, by name."""
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_id: int | None = None,
    ) -> list[int]:
        """New tokens after ``prompt_ids`` (not including it): temperature sampling
        (0 = greedy) with nucleus ``top_p``, stopping before ``eos_id`` or after
        ``max_new_tokens``; the model sees at most ``context_length`` tokens."""

def preset_config(name: str) -> dict[str, Any]:
    """The configuration of a named model (``tinystories``, ``bench-small``,
    ``gpt2-small``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``) for
    ``TransformerLM`` or ``train``'s ``model``."""

def train(config: dict[str, Any] | str | os.PathLike[str]) -> pathlib.Path:
    """Runs the training loop (AdamW, cosine schedule, clipping, validation, JSONL
    log, loss plots, checkpoints) as ``config`` says — a dict with the training keys
    and the model under ``model``, or a ``.toml``/``.json`` file — and returns the
    run directory (``out_dir``). Progress goes to stderr; Ctrl-C stops cleanly
    (checkpoint first) and raises ``KeyboardInterrupt``.

    With ``resume`` (a checkpoint path) the run continues with the configuration
    the checkpoint recorded — ``tinylm.train({"resume": path})`` takes it to its
    planned end with the same losses as a run that never stopped; the other keys
    given override it (each change is printed to stderr), except the model's, which
    raise ``ValueError`` naming the key. ``schedule="time"`` runs the learning-rate
    schedule over ``time_budget_s`` instead of the steps. The keys ``device``
    (``cpu``, ``cuda``, ``cuda:N``, ``auto``) and ``precision`` (``auto``, the
    default: bf16 where the CPU or GPU multiplies bf16 natively; ``bf16``; ``fp32``)
    choose where and how it trains."""


def sweep(
    out: str | os.PathLike[str],
    config: dict[str, Any] | str | os.PathLike[str],
    grid: dict[str, Sequence[Any]] | None = None,
    variants: Sequence[str] | dict[str, dict[str, Any]] | None = None,
    parallel: int = 1,
) -> list[dict[str, Any]]:
    """Trains one run per point of ``grid`` (configuration key → values; model keys
    bare, e.g. ``{"lr_max": [1e-3, 3e-3], "d_model": [128, 256]}``) times
    ``variants`` (preset names ``baseline``, ``no-norm``, ``post-norm``, ``nope``,
    ``silu``, or ``"NAME:KEY=V,KEY=V"``, or a dict name → keys) over the base
    ``config`` (as ``train`` takes it; its ``out_dir`` is replaced, it may not
    ``resume``), each in a directory of ``out`` named by its
    values, ``parallel`` at a time; then writes ``summary.csv`` and the plots
    ``loss.{svg,png}`` and ``loss_wall.{svg,png}`` in ``out``, prints the summary
    table to stderr and returns a dict per run (``name``, ``dir``, ``values``,
    ``status`` — ``finished``, ``stopped``, ``diverged``, ``failed`` or ``not run`` —,
    ``steps``, ``train_loss``, ``val_loss``, ``tokens_per_s``, ``wallclock_s``,
    ``diverged_step``, ``error``). Called again with the same arguments it skips
    the runs that ended and resumes the others. A run that diverges (a non-finite
    loss, or above ``diverge_factor`` times its first) ends ``diverged`` and the
    sweep goes on. Raises ``ValueError`` naming an unknown key or a value that does
    not parse; Ctrl-C stops the runs cleanly and raises ``KeyboardInterrupt``."""

def plot(
    runs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] = "loss.png",
    x: str = "step",
    log_x: bool = False,
    log_y: bool = False,
    title: str | None = None,
) -> pathlib.Path:
    """Draws the training and validation losses of many runs on one figure (a run
    directory, or a sweep directory of them, or a list of either) against ``x``
    (``step``, ``tokens`` or ``wall``) to ``out`` (``.svg`` or ``.png``) and returns
    its path. The legend names the configuration keys that differ between the
    runs; diverged runs end at their last finite loss, marked. Raises ``ValueError``
    for a directory with no runs."""

# The submodules hold the functions typed in the package modules of the same names;
# ``nn``'s ``rope``, ``softmax``, ``scaled_dot_product_attention`` and
# ``multihead_self_attention`` in fixed-rank forms that ``tinylm.nn`` wraps.
from tinylm import checkpoint as checkpoint
from tinylm import data as data
from tinylm import nn as nn
from tinylm import optim as optim
