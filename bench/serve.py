"""tinylm serve against llama.cpp's llama-server on the same weights (bench/serve.sh
runs it).

For each model and each precision (f32, bf16, q8_0), three servers run side by
side, each with 8 slots and the same threads: `tinylm serve` (f32 and q8_0 on the
checkpoint, bf16 on its bf16 weights file), the same with `--api-key` while a
scraper reads its `/metrics` once a second, and `llama-server` on the checkpoint's
GGUF file of that precision (`-np 8`, a context of 8 × the model's). In each of
ROUNDS rounds, in an order that turns from round to round, each server answers one
streaming client, then CLIENTS streaming clients at once: every client sends one
completion of a prompt of its own (a number first, so no server finds it cached),
greedy, `ignore_eos`, MAX_TOKENS tokens. The clients read their streams whole off
the socket, noting when the first `data:` event came. Prints each round, then the
best of the rounds: tokens per second of wall time (all clients together), the
median time to the first chunk at CLIENTS clients, and the ratios, best to best
and each round's (on a machine that other work shares, the rounds' ratios say how
far the noise reaches). A precision whose llama-server does not start is reported
as not measured. With `--guards-only`, only the two tinylm servers run, and each
round's ratio of the guarded one to the plain one is printed with the median and
the middle half of the rounds' ratios: the cost of `--api-key` and `/metrics`,
measured closer than best to best. Standard library only.
"""

import argparse
import json
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

PRECISIONS = {
    # precision: (tinylm's --precision, the file tinylm reads, llama.cpp's GGUF type)
    "f32": ("fp32", "checkpoint", "f32"),
    "bf16": ("bf16", "bf16_weights", "bf16"),
    "q8_0": ("q8_0", "checkpoint", "q8_0"),
}
KEY = "bench-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    """A server process, its port and its log."""

    def __init__(self, name, command, port, key=None):
        self.name, self.port, self.key = name, port, key
        self.log = tempfile.NamedTemporaryFile("w+", prefix=name.replace(" ", "-") + "-", suffix=".log")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited with status {self.process.returncode}:\n"
                                   + open(self.log.name).read()[-1500:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not start:\n" + open(self.log.name).read()[-3000:])

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def stream(port, prompt, max_tokens, key):
    """One streamed completion read whole off the socket: (seconds to the first
    `data:` event, tokens). Every completion must run to max_tokens."""
    body = json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "ignore_eos": True,
    }).encode()
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    start = time.perf_counter()
    first = None
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\n" + auth +
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = []
        while block := s.recv(1 << 16):
            if first is None and b"data: " in b"".join(received[-1:]) + block:
                first = time.perf_counter() - start
            received.append(block)
    text = b"".join(received).decode(errors="replace")
    assert text.startswith("HTTP/1.1 200"), text[:500]
    assert text.count('"finish_reason":"length"') == 1, text[-500:]
    return first, max_tokens


def clients_at_once(port, prompts, max_tokens, key):
    """One client per prompt, started together: tokens per second of wall time, and
    the median time to a client's first chunk."""
    results = [None] * len(prompts)

    def run(i):
        try:
            results[i] = stream(port, prompts[i], max_tokens, key)
        except Exception as e:  # noqa: BLE001 - reported below, with the client's number
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for i, r in enumerate(results):
        if isinstance(r, Exception):
            raise RuntimeError(f"client {i} failed") from r
    return sum(r[1] for r in results) / wall, statistics.median(r[0] for r in results)


def scrape(port, stop):
    """Reads /metrics once a second until `stop` is set."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {KEY}"})
    while not stop.wait(1.0):
        with urllib.request.urlopen(request, timeout=10) as r:
            assert b"tinylm_generated_tokens_total" in r.read()


def measure(server, prompt_text, n, max_tokens, counter):
    """One client, then `n` at once, on `server`: (1-client tok/s, n-client tok/s,
    n-client median first chunk)."""
    def prompts(k):
        counter[0] += k
        return [f"{counter[0] - i}. {prompt_text}" for i in range(k)]
    stop = threading.Event()
    scraper = None
    if server.key:
        scraper = threading.Thread(target=scrape, args=(server.port, stop))
        scraper.start()
    try:
        one, _ = clients_at_once(server.port, prompts(1), max_tokens, server.key)
        many, first = clients_at_once(server.port, prompts(n), max_tokens, server.key)
    finally:
        stop.set()
        if scraper:
            scraper.join()
    return one, many, first


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tinylm", required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", action="append", required=True,
                        help="NAME:CHECKPOINT:BF16_WEIGHTS:GGUF_PREFIX:PROMPT_FILE:CONTEXT:DESCRIPTION")
    parser.add_argument("--precisions", default="f32,bf16,q8_0")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--guards-only", action="store_true",
                        help="tinylm with and without --api-key and /metrics only, no llama-server")
    args = parser.parse_args()
    summary = []
    for spec in args.model:
        name, checkpoint, bf16_weights, gguf, prompt_file, context, desc = spec.split(":", 6)
        prompt = open(prompt_file, encoding="utf-8").read()
        files = {"checkpoint": checkpoint, "bf16_weights": bf16_weights}
        print(f"== {name}: {desc}", flush=True)
        for precision in args.precisions.split(","):
            tinylm_precision, tinylm_file, dtype = PRECISIONS[precision]
            servers = []
            try:
                for label, key in [("tinylm", None), ("tinylm +key +metrics", KEY)]:
                    port = free_port()
                    command = [args.tinylm, "serve", "--checkpoint", files[tinylm_file], "--port", str(port),
                               "--slots", str(args.clients), "--threads", str(args.threads),
                               "--precision", tinylm_precision]
                    servers.append(Running(label, command + (["--api-key", key] if key else []), port, key))
                port = free_port()
                try:
                    if not args.guards_only:
                        servers.append(Running("llama-server", [
                            args.llama_server, "-m", f"{gguf}-{dtype}.gguf", "--host", "127.0.0.1",
                            "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads),
                            "-np", str(args.clients), "-c", str(int(context) * args.clients), "--no-webui"],
                            port))
                except RuntimeError as e:  # a build that this CPU cannot run, say: the other precisions go on
                    print(f"  {precision}: not measured: {e}", flush=True)
                    summary.append(f"{name} {precision}: not measured (llama-server did not start)")
                    continue
                counter = [0]
                for server in servers:  # warm-up: the first pass allocates its buffers
                    clients_at_once(server.port, [f"0. {prompt}"] * 2, 8, server.key)
                best = {s.name: [0.0, 0.0, float("inf")] for s in servers}
                ratios = []  # each round's tinylm ÷ llama-server: (1 client, CLIENTS clients)
                guarded = []  # each round's tinylm with guards ÷ without: (1 client, CLIENTS clients)
                for r in range(args.rounds):
                    order = servers[r % len(servers):] + servers[:r % len(servers)]
                    figures, measured = [], {}
                    for server in order:
                        one, many, first = measure(server, prompt, args.clients, args.max_tokens, counter)
                        measured[server.name] = (one, many)
                        b = best[server.name]
                        b[0], b[1], b[2] = max(b[0], one), max(b[1], many), min(b[2], first)
                        figures.append(f"{server.name} {one:.1f} / {many:.1f} tok/s, first chunk {first * 1e3:.0f} ms")
                    t, k = measured["tinylm"], measured["tinylm +key +metrics"]
                    guarded.append((k[0] / t[0], k[1] / t[1]))
                    if not args.guards_only:
                        l = measured["llama-server"]
                        ratios.append((t[0] / l[0], t[1] / l[1]))
                    load = " ".join(open("/proc/loadavg").read().split()[:3])
                    print(f"  {precision} round {r + 1} (load {load}): 1 / {args.clients} clients: "
                          + "; ".join(figures), flush=True)
                if args.guards_only:
                    line = f"{name} {precision}: with --api-key and /metrics ÷ without, over {args.rounds} rounds: "
                    for i, clients in [(0, 1), (1, args.clients)]:
                        q = statistics.quantiles([g[i] for g in guarded], n=4)
                        line += (f"{clients} client(s) median {statistics.median(g[i] for g in guarded):.3f} "
                                 f"(middle half {q[0]:.3f}-{q[2]:.3f}); ")
                    print("rounds: " + line, flush=True)
                    summary.append(line)
                    continue
                t, k, l = best["tinylm"], best["tinylm +key +metrics"], best["llama-server"]
                line = (f"{name} {precision}: 1 client {t[0]:.1f} / {l[0]:.1f} tok/s ({t[0] / l[0]:.2f}x); "
                        f"{args.clients} clients {t[1]:.1f} / {l[1]:.1f} tok/s ({t[1] / l[1]:.2f}x); "
                        f"first chunk at {args.clients} clients {t[2] * 1e3:.0f} / {l[2] * 1e3:.0f} ms; "
                        f"with --api-key and /metrics {k[1]:.1f} tok/s ({k[1] / t[1]:.3f} of without); "
                        f"each round's ratio: 1 client {min(r[0] for r in ratios):.2f}-{max(r[0] for r in ratios):.2f}x, "
                        f"{args.clients} clients {min(r[1] for r in ratios):.2f}-{max(r[1] for r in ratios):.2f}x "
                        f"(median {statistics.median(r[1] for r in ratios):.2f}x)")
                print("best: " + line, flush=True)
                summary.append(line)
            finally:
                for server in servers:
                    server.stop()
    print("== best of each figure over the rounds (tinylm / llama-server)")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
