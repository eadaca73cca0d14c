"""Split patterns against Python's `regex` with tiktoken's own pattern strings, and
tokenizers trained with each pattern against tiktoken and Hugging Face `tokenizers`.

The texts: generated adversarial text, the TinyStories sample inside tinylm and
CS336's `corpus.en` (a fixture of the Rust tests).
"""

import pathlib
import random
import sys
import unicodedata

import pytest
import regex

import tinylm

CORPUS_EN = pathlib.Path(__file__).resolve().parents[2] / "crates/tinylm-bpe/tests/fixtures/cs336/corpus.en"
SPECIAL = "<|endoftext|>"


def tiktoken_patterns():
    """`pat_str` of tiktoken's gpt2, cl100k_base and o200k_base, from the installed
    tiktoken (its rank files are not needed: the loader is stubbed)."""
    from tiktoken_ext import openai_public

    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: {}
    openai_public.data_gym_to_mergeable_bpe_ranks = lambda *args, **kwargs: {}
    return {
        "gpt2": openai_public.gpt2()["pat_str"],
        "gpt4": openai_public.cl100k_base()["pat_str"],
        "o200k": openai_public.o200k_base()["pat_str"],
    }


PATTERNS = tiktoken_patterns()


def adversarial_text(seed, n):
    """Characters of every Unicode general category, mixed scripts, digit runs, CRLF
    and whitespace runs, contractions in any case, camel case.

    Code points unassigned in this Python's `unicodedata` are left out: there the
    engines' Unicode versions differ (Python's `regex` is newer than the Rust `regex`
    under tiktoken and tinylm), so a character can be a letter for one and unassigned
    for the other."""
    rng = random.Random(seed)
    by_category = {}
    for code in range(0x110000):
        category = unicodedata.category(chr(code))
        if category not in ("Cs", "Cn"):
            by_category.setdefault(category, []).append(chr(code))
    categories = sorted(by_category)
    pieces = [
        " ", "  ", "\t", "\n", "\r\n", "\r\n\r\n", " \n ", "\u00a0", "\u3000", "\u2028",
        "'s", "'S", "'ll", "'LL", "'Re", "'ve", "'M", "'D", "'T", "'ſ", "'",
        "HTTPServer", "helloWorld", "DON'T", "we'RE", "ǅungla", "ʰAB",
        "1", "12", "123", "1234567", "٣٤٥", "½", "Ⅻ",
        "日本語", "Здравствуй", "مرحبا", "हिन्दी", "👋🏽", "👨‍👩‍👧", "e\u0301", "/", "//", "...", "!?",
    ]
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append(rng.choice(pieces))
        else:
            out.append(rng.choice(by_category[rng.choice(categories)]))
    return "".join(out)


def corpus_texts():
    texts = [adversarial_text(seed, 20_000) for seed in range(5)]
    return texts + [tinylm.tinystories(), CORPUS_EN.read_text(encoding="utf-8")]


@pytest.mark.parametrize("name", ["gpt2", "gpt4", "o200k"])
def test_pretokens_equal_regex_findall(name):
    compiled = regex.compile(PATTERNS[name])
    for text in corpus_texts():
        ours = tinylm.pretokenize(text, name)
        if ours != compiled.findall(text):
            theirs = compiled.findall(text)
            at = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            pytest.fail(f"{name}: pre-token {at}: tinylm {ours[at:at + 3]!r}, regex {theirs[at:at + 3]!r}")


def test_named_pattern_strings_are_tiktokens():
    for name, pat_str in PATTERNS.items():
        assert tinylm.Tokenizer.train_from_iterator(["ab"], 257, pattern=pat_str).pattern == name


def test_bad_pattern_names_the_regex_and_position():
    with pytest.raises(ValueError, match=r"invalid split pattern .*\(ab.* at byte"):
        tinylm.pretokenize("x", r"(ab")


@pytest.mark.parametrize("name", ["gpt2", "gpt4", "o200k"])
def test_exports_encode_to_tinylms_ids(name, tmp_path):
    """Trained with `name`, exported to tiktoken and tokenizer.json: the same ids in
    tiktoken and in Hugging Face tokenizers as in tinylm, on the whole corpus (and in
    `transformers.PreTrainedTokenizerFast` on its first text)."""
    import tokenizers

    texts = corpus_texts()
    train_docs = [t[:2_000_000] for t in texts]
    tok = tinylm.Tokenizer.train_from_iterator(train_docs, 2_000, [SPECIAL], pattern=name)
    assert tok.pattern == name
    encoding = tok.to_tiktoken(tmp_path / "tok.tiktoken", name="test")
    tok.to_tokenizer_json(tmp_path / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    joined = [SPECIAL.join(texts[i : i + 2]) for i in range(0, len(texts), 2)]
    ours = tok.encode_batch(joined)
    theirs_tiktoken = encoding.encode_batch(joined, allowed_special="all")
    theirs_hf = [e.ids for e in hf.encode_batch(joined, add_special_tokens=False)]
    for i, (a, b, c) in enumerate(zip(ours, theirs_tiktoken, theirs_hf)):
        assert a == b, f"{name}: text {i}: tinylm and tiktoken differ first at id {first_difference(a, b)}"
        assert a == c, f"{name}: text {i}: tinylm and HF tokenizers differ first at id {first_difference(a, c)}"
    import transformers

    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert fast(joined[0], add_special_tokens=False)["input_ids"] == ours[0]
    assert tinylm.Tokenizer.from_tiktoken(tmp_path / "tok.tiktoken", name, {SPECIAL: 256}).encode_batch(joined) == ours
    assert tinylm.Tokenizer.from_tokenizer_json(tmp_path / "tokenizer.json").encode_batch(joined) == ours


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_train_from_iterator_equals_training_on_files(tmp_path):
    docs = [adversarial_text(seed, 500) for seed in range(40)]
    (tmp_path / "a.txt").write_text(SPECIAL.join(docs[:20]), encoding="utf-8")
    (tmp_path / "b.txt").write_text(SPECIAL.join(docs[20:]), encoding="utf-8")
    for name in ["gpt2", "gpt4", "o200k"]:
        from_iter = tinylm.Tokenizer.train_from_iterator(iter(docs), 700, [SPECIAL], pattern=name)
        from_files = tinylm.Tokenizer.train([tmp_path / "a.txt", tmp_path / "b.txt"], 700, [SPECIAL], pattern=name)
        assert from_iter.merges == from_files.merges
        assert from_iter.vocab == from_files.vocab
        from_iter.save(tmp_path / name)
        loaded = tinylm.Tokenizer.load(tmp_path / name)
        assert loaded.pattern == name and loaded.special_tokens == [SPECIAL]
        assert loaded.encode(docs[0] + SPECIAL) == from_iter.encode(docs[0] + SPECIAL)


def test_train_from_iterator_rejects_non_strings_and_passes_errors_on():
    with pytest.raises(ValueError, match="expects strings, got int"):
        tinylm.Tokenizer.train_from_iterator(["ok", 3], 300)

    def failing():
        yield "fine"
        raise KeyError("from the iterator")

    with pytest.raises(KeyError, match="from the iterator"):
        tinylm.Tokenizer.train_from_iterator(failing(), 300)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
