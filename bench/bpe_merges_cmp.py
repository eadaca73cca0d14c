"""Compare tinylm's merges.txt with rustbpe's (bench/bpe_train_ref.py --merges-out).

    python bench/bpe_merges_cmp.py TINYLM_DIR/merges.txt RUSTBPE_MERGES [N]

Prints, for the first N merges (default 1000): how many are equal at the same rank, how
many are in both lists, and the first ranks where they differ. Equal-count pairs may be
merged in another order (each trainer breaks ties its own way).

    tinylm bpe train --input mix.txt --vocab-size 32000 --special-token '<|endoftext|>' \
        --out tok --pattern gpt4
    python bench/bpe_train_ref.py --pattern gpt4 --merges-out rust.txt rustbpe mix.txt 31999
    python bench/bpe_merges_cmp.py tok/merges.txt rust.txt 1000
"""

import sys

from encode_ref import gpt2_byte_table


def main(tinylm_path, rustbpe_path, n=1000):
    u = gpt2_byte_table()
    with open(tinylm_path, encoding="utf-8") as f:
        ours = [
            tuple(bytes(u[c] for c in part) for part in line.rstrip("\n").split(" "))
            for line in f
            if not line.startswith("#version")
        ][:n]
    with open(rustbpe_path) as f:
        theirs = [
            tuple(bytes(int(v) for v in part.split(",")) for part in line.split()) for line in f
        ][:n]
    same = [a == b for a, b in zip(ours, theirs)]
    rank = {m: i for i, m in enumerate(theirs)}
    moved = [abs(i - rank[m]) for i, m in enumerate(ours) if m in rank]
    print(
        f"first {n} merges: {sum(same)} equal at the same rank, {len(moved)} in both lists, "
        f"largest rank difference {max(moved, default=0)}"
    )
    for i in [i for i, s in enumerate(same) if not s][:5]:
        print(f"  rank {i}: tinylm {ours[i]}, rustbpe {theirs[i]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:4]))
