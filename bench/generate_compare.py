"""tinylm generate against llama.cpp on the same weights (bench/generate.sh runs it).

For each model: `tinylm generate` on the checkpoint (`--precision fp32`, `bf16`, `q8_0`)
and on its weights in bf16 (`tinylm export weights`, `--precision bf16`: the file
llama.cpp's bf16 row has the counterpart of), and llama.cpp's `llama-completion` on
its `tinylm export gguf` files (f32, bf16, q8_0), greedy, the same prompt, the same
threads, alternating in ROUNDS rounds so that the machine's load hits all alike.
Each round runs every program twice:
- to the first new token (`--max-tokens 1`, `-n 1`): the whole process's wall-clock
  time from its start to its exit;
- to NEW new tokens: the load time, prompt speed and generation speed it reports
  (tokens after the first over the time after the first: llama.cpp's "eval time",
  tinylm's `--verbose` "generation"). llama.cpp logs from a thread of its own, which
  the process's exit often cuts short before the timings of a one-token run, so
  these come from the long run (repeated, at most 5 times, until they are there).
llama.cpp runs without its warm-up decode (`--no-warmup`), so that its process does
no more than tinylm's. Prints per model a table of the best and the median over the
rounds (and, for each llama.cpp row, tinylm's speed relative to it from the best
figures — each against tinylm in the same weights' format: above 1, tinylm is
faster), and whether the greedy texts of tinylm and llama.cpp f32 agree.

A token's decode reads every weight but the token embeddings' once (the embeddings
one row), so each row's generation speed is also shown as the bytes of those weights
it reads a second. Set beside the machine's read bandwidth (`--read-bandwidth`:
bench/read_bandwidth.c, run once a round, since a shared machine's memory speed
moves from minute to minute), it says how close to the memory's speed a program
decodes, and so how much faster any program can be on these weights. Weights that
fit in the caches, as the quickstart's, are read from there: their figure is no
memory speed.
"""

import argparse
import json
import math
import re
import struct
import statistics
import subprocess
import sys
import time

LLAMA_DTYPES = ["f32", "bf16", "q8_0"]
# tinylm's rows: label -> (`--precision`, the model's file it reads).
TINYLM_ROWS = {
    "f32": ("fp32", "checkpoint"),
    "bf16": ("bf16", "bf16_weights"),
    "bf16, f32 checkpoint": ("bf16", "checkpoint"),
    "q8_0": ("q8_0", "checkpoint"),
}
# The tinylm row each llama.cpp row is held against: the same weights' format.
COUNTERPART = {"f32": "f32", "bf16": "bf16", "q8_0": "q8_0"}
# Bytes a matrix's value takes in each format (Q8_0: an f16 scale and 32 int8 values
# a block of 32); vectors (the RMSNorm gains) stay f32 in all.
MATRIX_BYTES = {"f32": 4, "bf16": 2, "q8_0": 34 / 32}


def read_per_token(checkpoint, fmt):
    """Bytes a decode step reads of the weights in format `fmt`: every parameter in
    the tinylm checkpoint's header but the optimizer's moments and the token
    embeddings (of which a step reads one row)."""
    with open(checkpoint, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__" or name.startswith("optim.") or name == "token_embeddings.weight":
            continue
        shape = tensor["shape"]
        total += math.prod(shape) * (MATRIX_BYTES[fmt] if len(shape) == 2 else 4)
    return total


def run(cmd):
    """Runs `cmd`; returns (wall seconds, stdout, stderr); exits on failure."""
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    wall = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall, p.stdout, p.stderr


def number(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"no {what} in:\n{text[-3000:]}")
    return [float(g) for g in m.groups()]


def tinylm(args, model, row, n):
    precision, file = TINYLM_ROWS[row]
    wall, out, err = run([args.tinylm, "generate", "--checkpoint", model[file],
                          "--prompt", model["prompt"], "--max-tokens", str(n), "--temperature", "0",
                          "--threads", str(args.threads), "--precision", precision, "--verbose"])
    if n == 1:
        return {"wall": wall}
    load, = number(r"load:\s+([\d.]+) ms", err, "load time")
    prompt_ms, prompt_tokens = number(r"prompt:\s+([\d.]+) ms / (\d+) tokens", err, "prompt time")
    gen_ms, gen_tokens = number(r"generation:\s+([\d.]+) ms / (\d+) tokens", err, "generation time")
    return {"wall": wall, "load_ms": load, "prompt_tps": prompt_tokens / prompt_ms * 1e3,
            "prompt_tokens": int(prompt_tokens), "text": out, "gen_tps": gen_tokens / gen_ms * 1e3,
            "gen_tokens": int(gen_tokens)}


def llama(args, model, dtype, n):
    cmd = [args.llama_completion, "-m", f"{model['gguf']}-{dtype}.gguf",
           "-f", model["prompt_file"], "-n", str(n), "-t", str(args.threads),
           "-tb", str(args.threads), "--temp", "0", "-no-cnv", "-c", "0",
           "--no-warmup", "--no-display-prompt"]
    if n == 1:
        return {"wall": run(cmd)[0]}
    for _ in range(5):
        wall, out, err = run(cmd)
        if all(re.search(p, err) for p in [r"load time =", r"prompt eval time =", r"\d+ runs"]):
            break
    load, = number(r"load time =\s+([\d.]+) ms", err, "load time")
    prompt_ms, prompt_tokens = number(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens", err,
                                      "prompt eval time")
    gen_ms, runs = number(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", err, "eval time")
    return {"wall": wall, "load_ms": load, "prompt_tps": prompt_tokens / prompt_ms * 1e3,
            "prompt_tokens": int(prompt_tokens), "text": model["prompt"] + out,
            "gen_tps": runs / gen_ms * 1e3, "gen_tokens": int(runs)}


def summary(values, best):
    return f"{best(values):.3g} ({statistics.median(values):.3g})"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tinylm", required=True)
    p.add_argument("--llama-completion", required=True)
    p.add_argument("--model", action="append", required=True,
                   help="NAME:CHECKPOINT:BF16_WEIGHTS:GGUF_PREFIX:PROMPT_FILE:NEW_TOKENS:DESCRIPTION")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--read-bandwidth", required=True,
                   help="bench/read_bandwidth.c built: prints the memory's read speed, 'X GB/s'")
    args = p.parse_args()
    models = []
    for spec in args.model:
        name, ckpt, bf16_weights, gguf, prompt_file, new, desc = spec.split(":", 6)
        prompt = open(prompt_file, encoding="utf-8").read()
        models.append({"name": name, "checkpoint": ckpt, "bf16_weights": bf16_weights,
                       "gguf": gguf, "prompt_file": prompt_file,
                       "prompt": prompt, "new": int(new), "description": desc})
    results = {}  # (model, program) -> {"first": [...], "full": [...]}
    read_gbps = []  # the memory's read speed, a figure a round
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds} ...", file=sys.stderr)
        read_gbps += number(r"([\d.]+) GB/s", run([args.read_bandwidth, str(args.threads)])[1],
                            "read speed")
        for m in models:
            programs = [(f"tinylm {row}", lambda n, row=row: tinylm(args, m, row, n))
                        for row in TINYLM_ROWS]
            programs += [(f"llama.cpp {d}", lambda n, d=d: llama(args, m, d, n)) for d in LLAMA_DTYPES]
            for label, go in programs:
                slot = results.setdefault((m["name"], label), {"first": [], "full": []})
                slot["first"].append(go(1))
                slot["full"].append(go(m["new"]))
    print(f"memory: {args.threads} threads read {summary(read_gbps, max)} GB/s, best (median) of "
          f"{args.rounds} rounds (bench/read_bandwidth.c)")
    for m in models:
        print(f"\n{m['name']}: {m['description']}; greedy, {args.threads} threads, "
              f"{m['new']} new tokens; best (median) of {args.rounds} rounds")
        print("| program | time to first token, whole process (s) | load (ms) | prompt (tokens/s) "
              "| generation (tokens/s) | weights read in generation (GB/s) | against "
              "| its time to first token ÷ tinylm's | tinylm's generation ÷ its |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        for label in [f"tinylm {row}" for row in TINYLM_ROWS] + [f"llama.cpp {d}" for d in LLAMA_DTYPES]:
            res = results[(m["name"], label)]
            first, full = res["first"], res["full"]
            ttft = [x["wall"] for x in first]
            gen = [x["gen_tps"] for x in full]
            read = read_per_token(m["checkpoint"], label.split()[1].rstrip(",")) / 1e9
            row = (f"| {label} | {summary(ttft, min)} | {summary([x['load_ms'] for x in full], min)} "
                   f"| {summary([x['prompt_tps'] for x in full], max)} | {summary(gen, max)} "
                   f"| {summary([g * read for g in gen], max)} |")
            if label.startswith("llama.cpp"):
                ours_label = f"tinylm {COUNTERPART[label.split()[1]]}"
                ours = results[(m["name"], ours_label)]
                ours_ttft = min(x["wall"] for x in ours["first"])
                ours_gen = max(x["gen_tps"] for x in ours["full"])
                row += f" {ours_label} | {min(ttft) / ours_ttft:.2f}× | {ours_gen / max(gen):.2f}× |"
            else:
                row += " | | |"
            print(row)
        counts = {(label, x["prompt_tokens"], x["gen_tokens"])
                  for (name, label), res in results.items() if name == m["name"] for x in res["full"]}
        print("prompt tokens and tokens after the first, per program: "
              + "; ".join(f"{label} {p} + 1 + {g}" for label, p, g in sorted(counts)))
        a = results[(m["name"], "tinylm f32")]["full"][0]["text"]
        b = results[(m["name"], "llama.cpp f32")]["full"][0]["text"].rstrip("\n")
        a = a.rstrip("\n")
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"greedy text of tinylm f32 and llama.cpp f32: "
              + ("identical" if a == b else f"the same for the first {same} of {len(a)} characters"))


if __name__ == "__main__":
    main()
