"""Reference encoders for bench/encode.sh (GPT-2, single-threaded, from the local GPT-2
files) and bench/encode_patterns.sh (tiktoken on .tiktoken ranks under the cl100k or o200k
pattern, one thread or tiktoken's own parallel batch).

    encode_ref.py tiktoken|hf VOCAB_JSON MERGES_TXT INPUT OUT.npy
        encodes INPUT (with <|endoftext|> as a special token), writes the ids as uint16
        .npy, prints "<encode seconds> <tokens>" (the encode call alone).
    encode_ref.py tiktoken-ranks ENCODING RANKS INPUT OUT.npy THREADS|all [EOT_ID]
        tiktoken with the split pattern of ENCODING (cl100k_base or o200k_base, from
        tiktoken_ext.openai_public) and the ranks of the .tiktoken file RANKS (published
        ranks, or a tokenizer written by `tinylm bpe export --format tiktoken`). Special
        tokens: ENCODING's own when EOT_ID is not given, else {<|endoftext|>: EOT_ID}.
        THREADS 1: enc.encode(text, allowed_special={<|endoftext|>}). Otherwise (all:
        os.cpu_count()) the way tiktoken parallelizes: the text split at <|endoftext|> into
        documents, enc.encode_batch(docs, num_threads=THREADS, ...), the results joined with
        <|endoftext|>'s id between them (the same ids: tiktoken encodes the text between
        special tokens independently); the seconds cover split, encode and join. Writes
        uint16 when the vocabulary has at most 65,536 tokens, else uint32 (as tinylm does),
        prints "<encode seconds> <tokens>".
    encode_ref.py same A.npy B.npy
        prints "yes" when the two id arrays are equal, else where they first differ.

The gpt2 tiktoken is built as tiktoken.get_encoding("gpt2") builds it (same pattern, ranks,
special token), from the local vocab.json, since this machine cannot download it; likewise
cl100k_base and o200k_base from the .tiktoken files the tiktoken-rs crate ships.
"""
import os
import sys
import time

import numpy as np

EOT = "<|endoftext|>"


def gpt2_byte_table():
    """GPT-2's bytes_to_unicode, inverted: printable char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_gpt2(vocab, merges):
    import json

    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    # tiktoken's gpt2 ranks are GPT-2's encoder.json ids (tiktoken asserts this when it
    # builds them from vocab.bpe); merges.txt is implied by them.
    table = gpt2_byte_table()
    with open(vocab, encoding="utf-8") as f:
        encoder = json.load(f)
    ranks = {bytes(table[c] for c in tok): i for tok, i in encoder.items() if tok != EOT}
    enc = tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=50257,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT: 50256},
    )
    return lambda text: enc.encode(text, allowed_special={EOT})


def tiktoken_ranks(encoding, ranks_path, threads, eot_id=None):
    """tiktoken.Encoding with ENCODING's pattern and the local ranks; returns (encode, n_vocab)."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext import openai_public

    ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
    # openai_public's constructor downloads its ranks; hand it the local ones instead.
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
    spec = getattr(openai_public, encoding)()
    if eot_id is None:
        name, special = spec["name"], spec["special_tokens"]
    else:
        name, special = f"{encoding}-pattern:{os.path.basename(ranks_path)}", {EOT: int(eot_id)}
    enc = tiktoken.Encoding(name=name, pat_str=spec["pat_str"], mergeable_ranks=ranks, special_tokens=special)
    eot = special[EOT]
    if threads == 1:
        return (lambda text: enc.encode(text, allowed_special={EOT})), enc.n_vocab

    def encode_parallel(text):
        ids = []
        for i, doc in enumerate(enc.encode_batch(text.split(EOT), num_threads=threads, allowed_special={EOT})):
            if i:
                ids.append(eot)
            ids.extend(doc)
        return ids

    return encode_parallel, enc.n_vocab


def hf_gpt2(vocab, merges):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens([EOT])
    return lambda text: tok.encode(text).ids


def main():
    if sys.argv[1] == "same":
        a, b = np.load(sys.argv[2]), np.load(sys.argv[3])
        if a.shape == b.shape and (a == b).all():
            print("yes")
        else:
            n = min(len(a), len(b))
            diff = np.nonzero(a[:n] != b[:n])[0]
            print(f"no: lengths {len(a)} vs {len(b)}, first difference at {diff[0] if len(diff) else n}")
        return
    if sys.argv[1] == "tiktoken-ranks":
        encoding, ranks, path, out, threads = sys.argv[2:7]
        threads = os.cpu_count() if threads == "all" else int(threads)
        encode, n_vocab = tiktoken_ranks(encoding, ranks, threads, *sys.argv[7:8])
    else:
        which, vocab, merges, path, out = sys.argv[1:6]
        encode = {"tiktoken": tiktoken_gpt2, "hf": hf_gpt2}[which](vocab, merges)
        n_vocab = 50257
    with open(path, encoding="utf-8", newline="") as f:  # keep \r\n as it is
        text = f.read()
    start = time.perf_counter()
    ids = encode(text)
    seconds = time.perf_counter() - start
    np.save(out, np.asarray(ids, dtype=np.uint16 if n_vocab <= 65536 else np.uint32))
    print(f"{seconds:.4f} {len(ids)}")


if __name__ == "__main__":
    main()
