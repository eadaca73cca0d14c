"""Train the reference BPE trainers for bench/bpe_train.sh and bench/bpe_patterns.sh
(one trainer per process).

    python bench/bpe_train_ref.py [--pattern gpt2|gpt4] [--merges-out FILE] hf|rustbpe INPUT VOCAB_SIZE

- hf: Hugging Face `tokenizers` BpeTrainer, byte-level initial alphabet, special token
  <|endoftext|>. gpt2 (default): the ByteLevel pre-tokenizer (its built-in GPT-2 split
  regex), trained on the file (HF reads it line by line). gpt4: Split(Regex(cl100k's
  pattern), "isolated") then ByteLevel(use_regex=False), trained on the texts documents()
  yields (not lines: cl100k's `\s*[\r\n]` joins blank lines into one pre-token).
- rustbpe: nanochat's trainer, fed the texts documents() yields (the documents between
  <|endoftext|> markers, cut at exact pre-token boundaries into ~64 KiB pieces), the
  pattern given explicitly (rustbpe has no special tokens: its vocabulary is 256 +
  merges). Its own default pattern is *not* exactly cl100k's (no `\s++$` alternative, a
  last `\s+` for `\s`; see RUSTBPE_DEFAULT_PATTERN), so gpt4 passes tiktoken's
  cl100k_base pattern, the one `tinylm --pattern gpt4` uses.

Prints the number of merges learned. --merges-out writes rustbpe's merges in rank order,
one per line as two space-separated lists of byte values (`left right`, e.g. `116,104 101`),
for comparing with tinylm's merges.txt.
"""

import argparse
import re

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# tiktoken's cl100k_base pat_str (= tinylm's GPT4_PATTERN).
GPT4_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
# rustbpe 0.1.0's train_from_iterator default (Tokenizer().get_pattern() after training
# with pattern=None), for reference only.
RUSTBPE_DEFAULT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}
SPECIAL = "<|endoftext|>"


# Cuts that leave the pre-tokens as they are. GPT-2: after a line break between two
# non-whitespace characters ("x\nY" -> "x\n" | "Y": the whitespace run is the lone "\n"
# either way). cl100k: after the last line break of a whitespace run that a
# non-whitespace character ends ("x \r\n  Y" -> "x \r\n" | "  Y"): `\s*[\r\n]` ends
# its pre-token there in the whole text, `\s++$` in the piece.
CUTS = {
    "gpt2": re.compile(r"(?<=\S\n)(?=\S)"),
    "gpt4": re.compile(r"(?<=\n)(?=[^\S\r\n]*\S)"),
}


def documents(path, pattern, chunk=1 << 20, piece=1 << 16):
    """The texts between <|endoftext|> markers, read 1 MiB at a time with line ends kept
    as they are (newline="": no \\r\\n -> \\n, tinylm reads bytes), each cut into pieces
    of about 64 KiB at CUTS[pattern] points so that the trainers can use all cores and keep their
    per-text state small even where a document is a whole 8 MB book: the pre-token counts
    are those of the whole documents."""

    def pieces(doc):
        start = 0
        while len(doc) - start > piece:
            m = CUTS[pattern].search(doc, start + piece)
            if m is None:
                break
            yield doc[start : m.start()]
            start = m.start()
        yield doc[start:]

    rest = ""
    with open(path, encoding="utf-8", newline="") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            parts = (rest + block).split(SPECIAL)
            rest = parts.pop()
            for doc in parts:
                yield from pieces(doc)
    yield from pieces(rest)


def train_hf(path, vocab_size, pattern):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if pattern == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.train([path], trainer)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PATTERNS[pattern]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.train_from_iterator(documents(path, pattern), trainer)
    return tok.get_vocab_size() - 256 - 1, None


def train_rustbpe(path, vocab_size, pattern):
    import rustbpe

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(documents(path, pattern), vocab_size, pattern=PATTERNS[pattern])
    return tok.vocab_size - 256, tok


def write_rustbpe_merges(tok, out):
    """Rank order; each token's pair is what byte-pair encoding of it with the lower
    ranks only leaves (tiktoken's way of recovering merges from ranks)."""
    ranks = tok.get_mergeable_ranks()  # [(bytes, rank)] or {bytes: rank}
    ranks = {bytes(b): r for b, r in (ranks.items() if isinstance(ranks, dict) else ranks)}
    with open(out, "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            if rank < 256:
                continue
            parts = [token[i : i + 1] for i in range(len(token))]
            while len(parts) > 2:
                best = min(
                    range(len(parts) - 1),
                    key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 62),
                )
                parts[best : best + 2] = [parts[best] + parts[best + 1]]
            a, b = parts
            f.write(",".join(map(str, a)) + " " + ",".join(map(str, b)) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pattern", choices=sorted(PATTERNS), default="gpt2")
    ap.add_argument("--merges-out", help="rustbpe only: write its merges here")
    ap.add_argument("which", choices=["hf", "rustbpe"])
    ap.add_argument("input")
    ap.add_argument("vocab_size", type=int)
    args = ap.parse_args()
    train = {"hf": train_hf, "rustbpe": train_rustbpe}[args.which]
    merges, tok = train(args.input, args.vocab_size, args.pattern)
    if args.merges_out and tok is not None:
        write_rustbpe_merges(tok, args.merges_out)
    print(f"{args.which} ({args.pattern}): {merges} merges")
