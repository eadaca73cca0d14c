"""Type stubs of the Rust extension module ``tinylm._tinylm``."""

import os
from collections.abc import Iterable, Iterator

__version__: str

def train_bpe(
    input_path: str | os.PathLike[str],
    vocab_size: int,
    special_tokens: list[str] | None = None,
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Trains a byte-level BPE tokenizer on a UTF-8 text file (CS336 semantics).

    The vocabulary is the 256 bytes, then the special tokens, then one token per
    merge, ``vocab_size`` tokens in all. Ties between equally frequent pairs go to
    the lexicographically greater pair. Runs on all cores without the GIL.
    Raises ``FileNotFoundError``/``OSError`` for the file, ``ValueError`` for
    invalid UTF-8 or a ``vocab_size`` below ``256 + len(special_tokens)``.
    """

class Tokenizer:
    """A byte-level BPE tokenizer with GPT-2 semantics.

    ``vocab`` maps ids ``0..len(vocab)`` to bytes; ``merges`` lists the merges in
    order of creation. Special tokens absent from ``vocab`` are appended to it;
    in text they always become their single id (longest match first).
    """

    def __init__(
        self,
        vocab: dict[int, bytes],
        merges: list[tuple[bytes, bytes]],
        special_tokens: list[str] | None = None,
    ) -> None: ...
    @classmethod
    def from_files(
        cls,
        vocab_filepath: str | os.PathLike[str],
        merges_filepath: str | os.PathLike[str],
        special_tokens: list[str] | None = None,
    ) -> "Tokenizer":
        """Reads a GPT-2 style ``vocab.json`` and ``merges.txt``."""
    @property
    def vocab_size(self) -> int:
        """Number of tokens, special tokens included."""
    @property
    def vocab(self) -> dict[int, bytes]:
        """The vocabulary ``{id: bytes}``, special tokens included."""
    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (runs without the GIL)."""
    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of the concatenation of the strings of ``iterable`` (e.g. a text
        file's lines), lazily: memory stays bounded whatever the input's size, and
        the ids equal ``encode("".join(iterable))``."""
    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; malformed UTF-8 becomes U+FFFD. An id out of range
        raises ``ValueError``."""

class EncodeIterable(Iterator[int]):
    """The lazy iterator returned by ``Tokenizer.encode_iterable``."""

    def __iter__(self) -> "EncodeIterable": ...
    def __next__(self) -> int: ...
