"""tinylm.train_bpe and tinylm.Tokenizer against a reference trainer and GPT-2."""

import collections
import os
import pathlib
import random
import re
import subprocess
import sys
import textwrap

import pytest

import tinylm

SPECIAL = "<|endoftext|>"
# The GPT-2 pattern for ASCII text (where \p{L} is [A-Za-z] and \p{N} is [0-9]).
ASCII_PATTERN = re.compile(
    r"""'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""
)


def reference_train_bpe(text, vocab_size, special_tokens):
    """The CS336 algorithm, naively: recount all pairs before every merge."""
    vocab = {i: bytes([i]) for i in range(256)}
    for s in special_tokens:
        vocab[len(vocab)] = s.encode()
    split = "|".join(re.escape(s) for s in special_tokens)
    words = collections.Counter()
    for piece in re.split(split, text) if special_tokens else [text]:
        for m in ASCII_PATTERN.findall(piece):
            words[tuple(bytes([b]) for b in m.encode())] += 1
    merges = []
    while len(vocab) < vocab_size:
        pairs = collections.Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        new_words = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    return vocab, merges


def ascii_corpus(n_words, seed):
    rng = random.Random(seed)
    stems = ["low", "lower", "newest", "widest", "the", "cat", "sat", "on", "mat", "it's", "we'll"]
    parts = []
    for i in range(n_words):
        word = rng.choice(stems)
        if rng.random() < 0.1:
            word = word.upper()
        parts.append(word)
        parts.append(rng.choice([" ", " ", " ", "  ", "\n", ", ", ". ", " 42 ", "!! "]))
        if rng.random() < 0.02:
            parts.append(SPECIAL)
    return "".join(parts)


def test_train_bpe_equals_reference(tmp_path):
    text = ascii_corpus(3000, seed=1)
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    vocab, merges = tinylm.train_bpe(str(path), 400, [SPECIAL])
    ref_vocab, ref_merges = reference_train_bpe(text, 400, [SPECIAL])
    assert merges == ref_merges
    assert vocab == ref_vocab
    assert vocab[256] == SPECIAL.encode()


def test_train_bpe_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        tinylm.train_bpe(tmp_path / "missing.txt", 300, [])
    path = tmp_path / "bad.txt"
    path.write_bytes(b"abc \xff\xfe def")
    with pytest.raises(ValueError, match="UTF-8"):
        tinylm.train_bpe(path, 300, [])
    path.write_text("hello")
    with pytest.raises(ValueError, match="vocab size"):
        tinylm.train_bpe(path, 100, [])


def test_trained_tokenizer_round_trip(tmp_path):
    text = ascii_corpus(2000, seed=2)
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    vocab, merges = tinylm.train_bpe(path, 350, [SPECIAL])
    tok = tinylm.Tokenizer(vocab, merges, [SPECIAL])
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids.count(256) == text.count(SPECIAL)
    assert len(ids) < len(text.encode()) / 2


GPT2_TEXTS = [
    "Hello, world! It's a test.",
    "Once upon a time, there was a little girl named Lily.<|endoftext|>The end.",
    "  leading spaces\n\n\ttabs and newlines   \n",
    "contractions: I'll we've they're she'd he's DON'T",
    "numbers 1234567 3.14159 and symbols @#$%^&*()",
    "Unicode: héllo wörld, 日本語のテキスト, emoji 🎉🚀, Ελληνικά, русский",
    "<|endoftext|><|endoftext|>",
    "",
    " ",
    "a" * 1000,
]


def test_gpt2_encode_equals_tiktoken(gpt2_files, tiktoken_gpt2):
    tok = tinylm.Tokenizer.from_files(*gpt2_files, special_tokens=[SPECIAL])
    assert tok.vocab_size == 50257
    for text in GPT2_TEXTS:
        expected = tiktoken_gpt2.encode(text, allowed_special="all")
        assert tok.encode(text) == expected, text
        assert tok.decode(expected) == text


def test_gpt2_long_mixed_text(gpt2_files, tiktoken_gpt2):
    rng = random.Random(3)
    alphabet = list("abcdefghij ABC  \n\n'.,!?0123") + ["é", "日", "🎉", "ß", SPECIAL, "'ll", "'s"]
    text = "".join(rng.choice(alphabet) for _ in range(20000))
    tok = tinylm.Tokenizer.from_files(*gpt2_files, special_tokens=[SPECIAL])
    expected = tiktoken_gpt2.encode(text, allowed_special="all")
    assert tok.encode(text) == expected
    # Chunks cut anywhere (inside words, specials and characters' neighbours).
    cuts = sorted(rng.sample(range(1, len(text)), 500))
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    it = tok.encode_iterable(iter(chunks))
    assert next(it) == expected[0]
    assert [expected[0]] + list(it) == expected


def test_overlapping_specials_longest_wins(gpt2_files):
    double = SPECIAL + SPECIAL
    tok = tinylm.Tokenizer.from_files(*gpt2_files, special_tokens=[SPECIAL, double])
    ids = tok.encode("a" + double + "b" + SPECIAL)
    assert ids[1] == 50257 and ids[-1] == 50256
    assert tok.decode(ids) == "a" + double + "b" + SPECIAL


def test_decode_errors_and_replacement(gpt2_files):
    tok = tinylm.Tokenizer.from_files(*gpt2_files)
    ids = {token: i for i, token in tok.vocab.items()}
    # The first byte of "€" alone is malformed UTF-8.
    assert tok.decode([ids[b"\xe2"], ids[b"a"]]) == "\ufffda"
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([50257])
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([-1])


def test_constructor_errors(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tinylm.Tokenizer(vocab, [(b"a", b"b")])
    with pytest.raises(ValueError, match="out of range"):
        tinylm.Tokenizer({**vocab, 300: b"ab"}, [])
    with pytest.raises(FileNotFoundError):
        tinylm.Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(ValueError, match="strings"):
        list(tinylm.Tokenizer(vocab, []).encode_iterable([b"bytes"]))


def test_encode_iterable_is_lazy():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = tinylm.Tokenizer(vocab, [])
    pulled = []

    def lines():
        for i in range(1000):
            pulled.append(i)
            yield "line %d\n" % i

    it = tok.encode_iterable(lines())
    assert next(it) == ord("l")
    assert len(pulled) <= 2


MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import tinylm

    vocab_path, merges_path, text_path = sys.argv[1:]
    tok = tinylm.Tokenizer.from_files(vocab_path, merges_path, ["<|endoftext|>"])
    with open(text_path, encoding="utf-8") as f:
        expected = tok.encode(f.read())

    def address_space():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    limit = address_space() + (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        bytearray(128 << 20)
        sys.exit("the address-space limit is not in force")
    except MemoryError:
        pass
    n = 0
    with open(text_path, encoding="utf-8") as f:
        for n, token in enumerate(tok.encode_iterable(f), 1):
            if token != expected[n - 1]:
                sys.exit(f"id {n - 1}: {token} != {expected[n - 1]}")
    if n != len(expected):
        sys.exit(f"{n} ids, expected {len(expected)}")
    print("ok", n, "ids under", limit, "bytes of address space")
    """
)


def test_encode_iterable_under_address_space_limit(tmp_path, gpt2_files):
    rng = random.Random(4)
    words = ["the", "little", "girl", "named", "Lily", "héllo", "日本", "dog's", "42", "!"]
    path = tmp_path / "big.txt"
    with open(path, "w", encoding="utf-8") as f:
        size = 0
        while size < 5_000_000:
            line = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 30)))
            line += "\n" if rng.random() > 0.05 else "\n<|endoftext|>\n"
            size += len(line.encode())
            f.write(line)
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, *map(str, gpt2_files), str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "RAYON_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok")
