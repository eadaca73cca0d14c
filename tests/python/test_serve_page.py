"""The page at ``/`` of ``tinylm serve`` in headless Chromium: a person types a
prompt and watches the text stream in."""

import openai

from conftest import Server
from serve_page import generate_on_page


def test_the_page_streams_the_completion_of_a_typed_prompt(server, tmp_path):
    shown = generate_on_page(
        server.url + "/", "The little bird", screenshot=tmp_path / "page.png",
        max_tokens=100, temperature=0.8, seed=4,
    )
    assert shown["state"] == "done", shown
    # The same request through the API gives the same text.
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    want = client.completions.create(
        model=server.name, prompt="The little bird", max_tokens=100, temperature=0.8,
        top_p=0.95, seed=4,
    ).choices[0].text
    assert shown["text"] == "The little bird" + want
    # The text came in many chunks, each shown as it came; the stats line counts
    # the tokens.
    assert shown["chunks"] > 10 and shown["text_changes"] > 10, shown
    assert "tokens in" in shown["stats"] and "first token after" in shown["stats"]
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_the_page_asks_a_guarded_server_s_key(served_checkpoint):
    checkpoint, _ = served_checkpoint
    server = Server(checkpoint, "--slots", 2, "--threads", 2, "--api-key", "page-key")
    try:
        shown = generate_on_page(
            server.url + "/", "The dog", key="page-key", max_tokens=20, temperature=0, seed=1
        )
        assert shown["state"] == "done", shown
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="page-key", max_retries=0)
        want = client.completions.create(
            model=server.name, prompt="The dog", max_tokens=20, temperature=0
        ).choices[0].text
        assert shown["text"] == "The dog" + want
    finally:
        server.close()
