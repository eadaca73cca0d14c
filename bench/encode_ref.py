"""Reference encoders for bench/encode.sh, single-threaded, from the local GPT-2 files.

    encode_ref.py tiktoken|hf VOCAB_JSON MERGES_TXT INPUT OUT.npy
        encodes INPUT (with <|endoftext|> as a special token), writes the ids as uint16
        .npy, prints "<encode seconds> <tokens>" (the encode call alone).
    encode_ref.py same A.npy B.npy
        prints "yes" when the two id arrays are equal, else where they first differ.

tiktoken is built as tiktoken.get_encoding("gpt2") builds it (same pattern, ranks,
special token), from the local vocab.json, since this machine cannot download it.
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
    which, vocab, merges, path, out = sys.argv[1:6]
    encode = {"tiktoken": tiktoken_gpt2, "hf": hf_gpt2}[which](vocab, merges)
    with open(path, encoding="utf-8", newline="") as f:  # keep \r\n as it is
        text = f.read()
    start = time.perf_counter()
    ids = encode(text)
    seconds = time.perf_counter() - start
    np.save(out, np.asarray(ids, dtype=np.uint16))
    print(f"{seconds:.4f} {len(ids)}")


if __name__ == "__main__":
    main()
