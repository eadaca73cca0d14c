"""Checks `tinylm export` against the tools it targets (bench/export_check.sh runs it).

For one exported model (directory HF, file GGUF) and tinylm's own results:
- transformers: `AutoModelForCausalLM.from_pretrained(HF)` logits (float32) against
  `tinylm forward`'s, and `AutoTokenizer.from_pretrained(HF)` ids against
  `tinylm bpe encode`'s on real text with special tokens;
- llama.cpp (through llama-cpp-python, which builds it from source): logits of the
  GGUF file and its tokenizer's ids, against the same;
- the GGUF files (f32, f16, bf16, q8_0) read back with the `gguf` package: every
  tensor's bytes equal to the package's own conversion of the exported weights (q/k
  rows in llama.cpp's pair order), in the type llama.cpp's converter picks.
Prints the largest error relative to the logits' scale (max|a - b| / max|b|) and
exits non-zero above the tolerances (1e-4 transformers, 1e-3 llama.cpp).
"""

import argparse
import json
import sys

import numpy as np


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def check_transformers(args, ids, logits, text_ids, text):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    tok = AutoTokenizer.from_pretrained(args.hf)
    hf_ids = tok(text)["input_ids"]
    decoded = tok.decode(hf_ids)
    return {
        "tool": "transformers",
        "logits_rel_err": rel_err(hf_logits, logits),
        "ids_equal": hf_ids == text_ids,
        "tokens": len(text_ids),
        "decode_equal": decoded == text,
    }


def check_llama_cpp(args, ids, logits, text_ids, text, gguf_path, tool="llama.cpp"):
    from llama_cpp import Llama

    T = ids.shape[1]
    llm = Llama(model_path=gguf_path, n_ctx=T, n_batch=T, n_ubatch=T, logits_all=True,
                n_threads=args.threads, verbose=False)
    rows = []
    for seq in ids:
        llm.reset()
        llm.eval(seq.tolist())
        rows.append(np.array(llm.scores[:T], dtype=np.float32))
    cpp_logits = np.stack(rows)
    cpp_ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    decoded = llm.detokenize(cpp_ids, special=True).decode()
    return {
        "tool": tool,
        "logits_rel_err": rel_err(cpp_logits, logits),
        "ids_equal": cpp_ids == text_ids,
        "tokens": len(text_ids),
        "decode_equal": decoded == text,
    }


def check_gguf_tensors(args, dtype, path):
    """Every GGUF tensor, under llama.cpp's name, is the checkpoint's stored as
    llama.cpp's converter stores it for `--outtype dtype` (1-D tensors f32; for
    q8_0, rows that are not whole blocks f16), byte for byte as the `gguf`
    package's quantize makes it."""
    from gguf import GGUFReader, GGMLQuantizationType
    from gguf.quants import quantize
    from safetensors.numpy import load_file

    ckpt = load_file(args.checkpoint)
    names = {"token_embeddings.weight": "token_embd.weight", "ln_final.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"ln1": "attn_norm", "attn.q_proj": "attn_q", "attn.k_proj": "attn_k",
             "attn.v_proj": "attn_v", "attn.output_proj": "attn_output", "ln2": "ffn_norm",
             "ffn.w1": "ffn_gate", "ffn.w2": "ffn_down", "ffn.w3": "ffn_up"}
    types = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
             "bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0}
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    differ = []
    for name, w in ckpt.items():
        if name.startswith("optim."):
            continue
        if name in names:
            g = names[name]
        else:
            _, i, rest = name.split(".", 2)
            g = f"blk.{i}.{layer[rest.removesuffix('.weight')]}.weight"
        t = tensors.pop(g)
        want = types[dtype]
        if w.ndim <= 1:
            want = GGMLQuantizationType.F32
        elif want == GGMLQuantizationType.Q8_0 and w.shape[-1] % 32:
            want = GGMLQuantizationType.F16
        stored = np.asarray(t.data)
        if t.tensor_type != want or stored.tobytes() != quantize(w.astype(np.float32), want).tobytes():
            differ.append(f"{g} ({t.tensor_type.name}, expected {want.name})")
    arch = reader.fields["general.architecture"]
    return {"tool": f"gguf reader, {dtype}", "tensors_differing": differ, "unmatched": sorted(tensors),
            "architecture": bytes(arch.parts[arch.data[0]]).decode()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hf", required=True)
    p.add_argument("--gguf", required=True, action="append",
                   help="DTYPE=PATH of a `tinylm export gguf --dtype DTYPE` file (f32 required): "
                        "llama.cpp's logits are checked for f32 and printed for the others")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--ids", required=True, help="(B, T) ids given to tinylm forward")
    p.add_argument("--logits", required=True, help="tinylm forward's logits")
    p.add_argument("--text", required=True, help="real text, encoded by tinylm to --text-ids")
    p.add_argument("--text-ids", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-llama-cpp", action="store_true")
    args = p.parse_args()
    ggufs = dict(spec.split("=", 1) for spec in args.gguf)
    ids, logits = np.load(args.ids), np.load(args.logits)
    text = open(args.text, encoding="utf-8").read()
    text_ids = np.load(args.text_ids).astype(np.int64).tolist()
    ok = True
    results = [check_transformers(args, ids, logits, text_ids, text)]
    if not args.skip_llama_cpp:
        results.append(check_llama_cpp(args, ids, logits, text_ids, text, ggufs["f32"]))
    for r in results:
        tol = 1e-4 if r["tool"] == "transformers" else 1e-3
        ok &= r["logits_rel_err"] <= tol and r["ids_equal"] and r["decode_equal"]
        print(json.dumps(r))
    for dtype, path in ggufs.items():
        if dtype != "f32" and not args.skip_llama_cpp:
            r = check_llama_cpp(args, ids, logits, text_ids, text, path, f"llama.cpp {dtype} (not checked)")
            print(json.dumps(r))
    for dtype, path in ggufs.items():
        g = check_gguf_tensors(args, dtype, path)
        ok &= not g["tensors_differing"] and not g["unmatched"] and g["architecture"] == "llama"
        print(json.dumps(g))
    print("all checks passed" if ok else "CHECK FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
