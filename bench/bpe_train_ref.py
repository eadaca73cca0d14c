"""Train the reference BPE trainers for bench/bpe_train.sh (one trainer per process).

    python bench/bpe_train_ref.py hf|rustbpe INPUT VOCAB_SIZE

- hf: Hugging Face `tokenizers` BpeTrainer, ByteLevel pre-tokenizer (GPT-2 split
  regex, byte-level initial alphabet), special token <|endoftext|>.
- rustbpe: nanochat's trainer, fed the documents between <|endoftext|> markers with the
  GPT-2 split pattern (rustbpe has no special tokens: its vocabulary is 256 + merges).

Prints the number of merges learned.
"""

import sys

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPECIAL = "<|endoftext|>"


def train_hf(path, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([path], trainer)
    return tok.get_vocab_size() - 256 - 1


def train_rustbpe(path, vocab_size):
    import rustbpe

    with open(path, encoding="utf-8") as f:
        docs = f.read().split(SPECIAL)
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter(docs), vocab_size, pattern=GPT2_PATTERN)
    return tok.vocab_size - 256


if __name__ == "__main__":
    which, path, vocab_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    merges = {"hf": train_hf, "rustbpe": train_rustbpe}[which](path, vocab_size)
    print(f"{which}: {merges} merges")
