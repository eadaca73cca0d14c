"""The page of ``tinylm serve`` driven in headless Chromium (Debian's
``/usr/bin/chromium``) by Playwright: type a prompt, press Generate, watch the
text arrive. ``test_serve_page.py`` checks it; run as a script it takes the
screenshot in the docs::

    python tests/python/serve_page.py http://127.0.0.1:8080 docs/serve.png "Once upon a time"
"""

import sys

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
# What works on a machine without a network or a GPU: no sandbox (root), no
# background connections to Google's hosts, no GPU process.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def generate_on_page(url, prompt, screenshot=None, key=None, **settings):
    """Types ``prompt`` (and ``settings``: field id → value) into the page at
    ``url`` — first the API ``key`` when given, which the page must ask for —
    presses Generate and waits for the text to end. Returns what the page
    showed: the output's text, its chunk count, how many times the browser
    changed the output's text on the way, and the stats line."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 620})
            page.goto(url)
            if key is not None:
                page.wait_for_selector("#keybox:not([hidden])")
                page.fill("#key", key)
                page.click("#savekey")
            page.wait_for_function("document.getElementById('model').textContent !== ''")
            page.fill("#prompt", prompt)
            for field, value in settings.items():
                page.fill(f"#{field}", str(value))
            # Every change of the output's text, as the browser makes it.
            page.evaluate("""() => {
                window.textChanges = 0;
                new MutationObserver((changes) => { window.textChanges += changes.length; })
                    .observe(document.getElementById("output"),
                             {subtree: true, characterData: true, childList: true});
            }""")
            page.click("#generate")
            output = page.locator("#output")
            page.wait_for_function("document.getElementById('output').dataset.state !== 'streaming'")
            result = {
                "state": output.get_attribute("data-state"),
                "text": output.inner_text(),
                "chunks": int(output.get_attribute("data-chunks")),
                "text_changes": page.evaluate("window.textChanges"),
                "stats": page.locator("#stats").inner_text(),
            }
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
            return result
        finally:
            browser.close()


if __name__ == "__main__":
    url, out, prompt = sys.argv[1:4]
    shown = generate_on_page(url, prompt, screenshot=out, seed=1)
    print(shown["stats"])
