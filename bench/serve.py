"""Benchmark of ``tinylm serve`` (run by bench/serve.sh): total tokens/s of C
streaming clients at once against one client (each client streaming the same
number of completions one after the other), and the time to the first streamed
token on an idle server against ``tinylm generate``'s, in alternating rounds.

    python3 bench/serve.py TINYLM CHECKPOINT [--clients 8] [--requests 3] [--max-tokens 64]
        [--rounds 3] [--threads N]

Every request streams ``--max-tokens`` tokens (``ignore_eos``) after either the
same prompt — whose keys and values the server then finds in the cache an
earlier request left, as it would for a client that sends the same instructions
again — or a prompt of its own (a number first, so no two share a start). A
client reads its stream whole off the socket and counts its tokens from the
usage chunk, so the clients take little of the CPU the server runs on. The first
token's time is read event by event. Prints one line per round and the best of
each figure. Standard library only.
"""

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time

PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play "
          "outside in the park with her friends. One day,")


def request_body(max_tokens, seed, distinct=False):
    prompt = f"{seed}. {PROMPT}" if distinct else PROMPT
    return json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "top_p": 0.95,
        "seed": seed, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True},
    })


def stream(port, max_tokens, seed):
    """One streamed completion of a prompt of its own (none of it cached), read
    event by event: the time to its first text."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", "/v1/completions", body=request_body(max_tokens, seed, True),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    first = None
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if first is None and any(c["text"] for c in chunk["choices"]):
            first = time.perf_counter() - start
    connection.close()
    return first


def stream_tokens(port, max_tokens, seed, distinct):
    """One streamed completion read whole off the socket (no work per event, so
    the clients cost the machine next to nothing): its tokens, from the usage
    chunk."""
    body = request_body(max_tokens, seed, distinct).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        received = []
        while block := s.recv(1 << 16):
            received.append(block)
    text = b"".join(received).decode()
    assert text.startswith("HTTP/1.1 200"), text[:500]
    usage = re.findall(r'"completion_tokens":(\d+)', text)
    return int(usage[-1])


def clients_at_once(port, clients, requests, max_tokens, seed, distinct):
    """``clients`` clients started together, each streaming ``requests``
    completions one after the other: total tokens per second of wall time."""
    tokens = [0] * clients
    def run(i):
        tokens[i] = sum(stream_tokens(port, max_tokens, seed + 1000 * i + r, distinct)
                        for r in range(requests))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert sum(tokens) == clients * requests * max_tokens, tokens
    return sum(tokens) / wall


def generate_first_token_ms(tinylm, checkpoint, options):
    """``tinylm generate``'s prompt time: from its prompt's start to its first new token (`--verbose`)."""
    out = subprocess.run(
        [tinylm, "generate", "--checkpoint", checkpoint, "--prompt", PROMPT,
         "--max-tokens", "8", "--seed", "1", "--verbose"] + options,
        check=True, capture_output=True, text=True,
    ).stderr
    return float(re.search(r"^prompt: +([0-9.]+) ms", out, re.M).group(1))


def describe_machine():
    """The CPU as /proc/cpuinfo names it, its cores and their load."""
    fields = {}
    for line in open("/proc/cpuinfo"):
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    avx512 = "AVX-512F" if "avx512f" in fields.get("flags", "").split() else "no AVX-512"
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"CPU: {fields.get('model name')} (family {fields.get('cpu family')}, model "
          f"{fields.get('model')}), {avx512}; {os.cpu_count()} cores, load average {load}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tinylm")
    parser.add_argument("checkpoint")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3, help="per client and round")
    parser.add_argument("--threads", type=int, default=0, help="0: all cores")
    parser.add_argument("--precision", default="auto", help="fp32, bf16 or auto")
    args = parser.parse_args()
    describe_machine()
    print(f"precision: {args.precision}")
    options = ["--precision", args.precision] + (["--threads", str(args.threads)] if args.threads else [])
    server = subprocess.Popen(
        [args.tinylm, "serve", "--checkpoint", args.checkpoint, "--port", "0",
         "--slots", str(args.clients)] + options,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in server.stderr:
            print("  server:", line.rstrip())
            found = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
                break
        stream(port, 4, 0)  # warm-up: the first pass allocates its buffers
        kinds = {"same prompt": False, "distinct prompts": True}
        best = {kind: (0.0, 0.0) for kind in kinds}
        best_ttft, best_generate = float("inf"), float("inf")
        for r in range(args.rounds):
            figures = []
            for kind, distinct in kinds.items():
                one = clients_at_once(port, 1, args.requests, args.max_tokens, 100 * r, distinct)
                many = clients_at_once(port, args.clients, args.requests, args.max_tokens, 100 * r,
                                       distinct)
                figures.append(f"{kind}: 1 client {one:.1f} tokens/s, {args.clients} clients "
                               f"{many:.1f} tokens/s ({many / one:.2f}x)")
                best[kind] = (max(best[kind][0], one), max(best[kind][1], many))
            generate = generate_first_token_ms(args.tinylm, args.checkpoint, options)
            ttft = min(stream(port, 4, 7 + 10 * r + i) for i in range(3)) * 1e3
            print(f"  round {r + 1}: " + "; ".join(figures) +
                  f"; first token: serve {ttft:.1f} ms, generate {generate:.1f} ms")
            best_ttft, best_generate = min(best_ttft, ttft), min(best_generate, generate)
        for kind, (one, many) in best.items():
            print(f"best, {kind}: 1 client {one:.1f} tokens/s; {args.clients} clients "
                  f"{many:.1f} tokens/s = {many / one:.2f}x")
        print(f"best first streamed token {best_ttft:.1f} ms vs tinylm generate's "
              f"{best_generate:.1f} ms ({best_ttft - best_generate:+.1f} ms)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
