"""Shared fixtures: GPT-2's tokenizer files and a reference encoder.

GPT-2's ``encoder.json``/``vocab.bpe`` (the ``vocab.json``/``merges.txt`` format) and
tiktoken's ``r50k_base`` ranks come from the ``tiktoken-rs`` crate, the Rust test
suite's GPT-2 reference (a dev-dependency of ``tinylm-bpe``, so ``cargo`` has it);
``tiktoken`` builds its encoder from those ranks without any download.
"""

import base64
import json
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@pytest.fixture(scope="session")
def gpt2_assets() -> pathlib.Path:
    """The ``assets`` folder of the ``tiktoken-rs`` crate, found by ``cargo metadata``."""
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--manifest-path", str(ROOT / "Cargo.toml")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    package = next(p for p in json.loads(out)["packages"] if p["name"] == "tiktoken-rs")
    return pathlib.Path(package["manifest_path"]).parent / "assets"


@pytest.fixture(scope="session")
def gpt2_files(gpt2_assets):
    """``(vocab.json, merges.txt)`` of GPT-2."""
    return gpt2_assets / "encoder.json", gpt2_assets / "vocab.bpe"


@pytest.fixture(scope="session")
def tiktoken_gpt2(gpt2_assets):
    """tiktoken's ``gpt2`` encoding built from the ``r50k_base`` ranks."""
    import tiktoken

    ranks = {}
    for line in (gpt2_assets / "r50k_base.tiktoken").read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name="gpt2_test",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
    )
