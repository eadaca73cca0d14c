"""``tinylm serve`` with real clients on loopback: the ``openai`` package for
completions, streams and errors; raw HTTP for what a client library never sends
(malformed JSON, unknown routes); several clients at once; a client that leaves.

The model is a small one trained for a few seconds (``served_checkpoint`` in
conftest.py); its text is checked against ``tinylm generate`` and against itself.
"""

import concurrent.futures
import http.client
import json
import socket
import subprocess
import time
import urllib.parse

import openai
import pytest

from conftest import tinylm_binary


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def raw(server, method, path, body=None):
    """``(status, JSON body)`` of one plain HTTP request."""
    url = urllib.parse.urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def stream_text(client, server, **request):
    """The chunks' texts of a streamed completion, and its last chunks."""
    chunks = list(client.completions.create(model=server.name, stream=True, **request))
    texts = [c.choices[0].text for c in chunks if c.choices]
    return texts, chunks


def test_models_lists_the_served_model(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].owned_by == "tinylm"


def test_greedy_completion_is_what_tinylm_generate_writes(client, server, served_checkpoint):
    checkpoint, _ = served_checkpoint
    prompt = "The dog sees"
    out = client.completions.create(
        model=server.name, prompt=prompt, max_tokens=40, temperature=0, seed=3
    )
    choice = out.choices[0]
    assert out.object == "text_completion" and out.model == "tiny"
    assert choice.index == 0 and choice.finish_reason in ("length", "stop")
    assert 0 < out.usage.completion_tokens <= 40
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    generated = subprocess.run(
        [str(tinylm_binary()), "generate", "--checkpoint", str(checkpoint), "--prompt", prompt,
         "--max-tokens", "40", "--temperature", "0", "--threads", "1"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert prompt + choice.text == generated.rstrip("\n")
    assert len(choice.text) > 20


def test_a_stream_arrives_in_chunks_that_add_up_to_the_completion(client, server):
    request = dict(prompt="A cat", max_tokens=30, temperature=0.9, top_p=0.95, seed=11)
    whole = client.completions.create(model=server.name, **request)
    texts, chunks = stream_text(client, server, stream_options={"include_usage": True}, **request)
    assert "".join(texts) == whole.choices[0].text
    assert len([t for t in texts if t]) > 5, "one chunk per token or so"
    # The last choice chunk carries the finish reason, then the usage chunk.
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The same prompt again: all its tokens but the last were found in the KV cache
    # the first request left, and its text (above) is the same all the same.
    assert whole.usage.prompt_tokens > 1
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1
    assert all(c.id == chunks[0].id and c.object == "text_completion" for c in chunks)


def test_the_stream_is_server_sent_events_ending_with_done(server):
    url = urllib.parse.urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = json.dumps({"prompt": "The sun", "max_tokens": 5, "stream": True, "seed": 1})
    connection.request("POST", "/v1/completions", body=body)
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type").startswith("text/event-stream")
    events = response.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    first = json.loads(events[0].removeprefix("data: "))
    assert set(first) == {"id", "object", "created", "model", "choices"}
    assert set(first["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}


def test_seeds_stop_strings_several_prompts_and_choices(client, server):
    request = dict(model=server.name, prompt="The old man", max_tokens=40, temperature=1.0)
    a = client.completions.create(seed=5, **request).choices[0].text
    assert a == client.completions.create(seed=5, **request).choices[0].text
    assert a != client.completions.create(seed=6, **request).choices[0].text
    # A stop string taken from the text cuts it just before its first occurrence.
    greedy = client.completions.create(model=server.name, prompt="The dog", max_tokens=40, temperature=0)
    text = greedy.choices[0].text
    stop = text[8:12]
    cut = client.completions.create(
        model=server.name, prompt="The dog", max_tokens=40, temperature=0, stop=[stop, "zzzz"]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # Two prompts, two choices each: choice p·n + k, echo puts the prompt first.
    out = client.completions.create(
        model=server.name, prompt=["A cat", "The sun"], n=2, max_tokens=8, seed=2, echo=True
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    starts = ["A cat", "A cat", "The sun", "The sun"]
    assert [c.text[: len(s)] for c, s in zip(out.choices, starts)] == starts
    assert all(len(c.text) > len(s) for c, s in zip(out.choices, starts))
    assert out.choices[0].text != out.choices[1].text


def test_bad_requests_are_openai_errors(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=3)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.name, prompt="x", max_tokens=500)
    assert e.value.param == "max_tokens" and "between 1 and 127" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.name, prompt="the dog " * 100, max_tokens=20)
    assert e.value.code == "context_length_exceeded"
    assert "maximum context length is 128 tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.name, prompt=[1, 2, 4000], max_tokens=3)
    assert "4000 at position 2" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.name, prompt="x", max_tokens=3, top_p=0)
    assert e.value.param == "top_p"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.name, prompt="x", max_tokens=3, logprobs=21)
    assert e.value.param == "logprobs"
    # What no client library sends.
    status, body = raw(server, "POST", "/v1/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "not a valid completion request" in body["error"]["message"]
    status, body = raw(server, "POST", "/v1/completions", b'{"prompt": 5}')
    assert status == 400 and "prompt to be a string" in body["error"]["message"]
    assert raw(server, "GET", "/v1/nothing")[0] == 404
    assert raw(server, "GET", "/v1/completions")[0] == 405
    # The server is still there.
    assert client.completions.create(model=server.name, prompt="x", max_tokens=2).choices


def test_logprobs_come_as_openai_writes_them(client, server):
    """The ``openai`` package reads the log-probabilities: the prompt's first token
    has none, each other token its own and the most probable tokens' at its place."""
    out = client.completions.create(
        model=server.name, prompt="The dog sees", max_tokens=6, temperature=0, echo=True, logprobs=3
    )
    logprobs = out.choices[0].logprobs
    assert "".join(logprobs.tokens) == out.choices[0].text
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for token, lp, top in zip(logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:]):
        assert lp <= 0 and token in top and top[token] == lp and 3 <= len(top) <= 4
    # Greedy: each new token is the most probable one.
    new = len(logprobs.tokens) - out.usage.prompt_tokens
    for token, top in zip(logprobs.tokens[-new:], logprobs.top_logprobs[-new:]):
        assert max(top, key=top.get) == token
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0


def test_clients_at_once_get_what_each_gets_alone(client, server):
    """Eight streaming clients at once (the server decodes 4 at a time, the others
    wait for a slot) each get the text the same request gets alone."""
    requests = [
        dict(prompt=p, max_tokens=30 + 5 * i, temperature=0.8, seed=i)
        for i, p in enumerate(["The dog", "A cat", "The sun", "A red fox"] * 2)
    ]
    alone = [client.completions.create(model=server.name, **r).choices[0].text for r in requests]

    def streamed(request):
        return "".join(stream_text(client, server, **request)[0])

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(streamed, requests))
    assert together == alone


def test_a_client_that_leaves_frees_its_slot(server):
    url = urllib.parse.urlparse(server.url)
    body = json.dumps({"prompt": "The dog", "max_tokens": 120, "n": 40, "stream": True})
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        received = b""
        while b"data: " not in received:
            received += s.recv(4096)
    line = server.wait_for_line(r"client left after \d+ tokens; its slot is free")
    tokens = int(line.split("after ")[1].split(" ")[0])
    assert tokens < 120
    # The server goes on serving.
    start = time.monotonic()
    status, body = raw(server, "POST", "/v1/completions", json.dumps({"prompt": "A", "max_tokens": 3}))
    assert status == 200 and time.monotonic() - start < 10
