"""Shared fixtures: GPT-2's tokenizer files and a reference encoder; a small
trained model served by ``tinylm serve`` on loopback.

GPT-2's ``encoder.json``/``vocab.bpe`` (the ``vocab.json``/``merges.txt`` format) and
tiktoken's ``r50k_base`` ranks come from the ``tiktoken-rs`` crate, the Rust test
suite's GPT-2 reference (a dev-dependency of ``tinylm-bpe``, so ``cargo`` has it);
``tiktoken`` builds its encoder from those ranks without any download.
"""

import base64
import json
import os
import pathlib
import random
import re
import subprocess
import threading
import time

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


# ---- `tinylm serve`: a small trained model and the server on loopback ----


def tinylm_binary() -> pathlib.Path:
    """The release ``tinylm`` binary, built (or found up to date) by cargo."""
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "tinylm-cli"],
        cwd=ROOT,
        check=True,
    )
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "release" / "tinylm"


@pytest.fixture(scope="session")
def served_checkpoint(tmp_path_factory):
    """A tokenizer and a small model trained on generated sentences for a few
    seconds: ``(checkpoint, tokenizer directory)``."""
    tinylm = tinylm_binary()
    work = tmp_path_factory.mktemp("served")
    rng = random.Random(7)
    subjects = ["the dog", "a cat", "the little bird", "a red fox", "the old man"]
    verbs = ["sees", "likes", "finds", "runs to", "looks at"]
    objects = ["the ball.", "a big tree.", "the river.", "a small house.", "the sun."]
    stories = []
    for _ in range(400):
        sentences = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}" for _ in range(6)]
        stories.append(" ".join(s.capitalize() for s in sentences))
    (work / "corpus.txt").write_text("<|endoftext|>".join(stories))

    def run(*args):
        subprocess.run([str(tinylm), *map(str, args)], check=True, capture_output=True)

    run("bpe", "train", "--input", work / "corpus.txt", "--vocab-size", 320,
        "--special-token", "<|endoftext|>", "--out", work / "tok")
    run("bpe", "encode", "--tokenizer", work / "tok", "--input", work / "corpus.txt",
        "--out", work / "train.npy")
    run("train", "--train-data", work / "train.npy", "--tokenizer", work / "tok",
        "--out-dir", work / "run", "--vocab-size", 320, "--context-length", 128,
        "--d-model", 64, "--num-layers", 2, "--num-heads", 4, "--d-ff", 128,
        "--batch-size", 16, "--steps", 150, "--warmup-steps", 10, "--lr-max", 1e-2,
        "--eval-interval", 0, "--threads", 2)
    return work / "run" / "checkpoint.safetensors", work / "tok"


class Server:
    """A ``tinylm serve`` process on loopback: its base URL, model name and the
    lines it wrote to stderr."""

    def __init__(self, checkpoint, *flags):
        self.process = subprocess.Popen(
            [str(tinylm_binary()), "serve", "--checkpoint", str(checkpoint), "--port", "0",
             "--name", "tiny", *map(str, flags)],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.name = "tiny"
        self.lines = []
        self.lines_seen = threading.Condition()
        self.url = None
        deadline = time.monotonic() + 60
        for line in self.process.stderr:
            self.lines.append(line)
            found = re.search(r"at (http://[0-9.:]+)/ ", line)
            if found:
                self.url = found.group(1)
                break
            if time.monotonic() > deadline:
                break
        if self.url is None:
            self.process.kill()
            raise RuntimeError("tinylm serve did not start:\n" + "".join(self.lines))
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stderr(self):
        for line in self.process.stderr:
            with self.lines_seen:
                self.lines.append(line)
                self.lines_seen.notify_all()

    def wait_for_line(self, pattern, timeout=10.0):
        """The first stderr line matching ``pattern``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self.lines_seen:
            while True:
                for line in self.lines:
                    if re.search(pattern, line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line matching {pattern!r} in:\n" + "".join(self.lines))
                self.lines_seen.wait(left)

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def server(served_checkpoint):
    """The served model with 4 slots, on 2 threads."""
    checkpoint, _ = served_checkpoint
    server = Server(checkpoint, "--slots", 4, "--threads", 2)
    yield server
    server.close()
