"""A page of another site, open in the developer's browser, cannot act on a local intake in
dev mode (unsigned, admin open): its requests to pause a line and to push a record, made
the ways a page can without asking the intake first (a `no-cors` fetch, a `text/plain`
body), are refused, and nothing changes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.browser import text_of, wait

pytestmark = pytest.mark.journal_independent

PAGE = """<!doctype html>
<title>loading</title>
<script>
const intake = "{intake}";
Promise.all([
  fetch(intake + "/v1/lines/order/pause", {{method: "POST", mode: "no-cors"}}),
  fetch(intake + "/v1/order", {{
    method: "POST", mode: "no-cors", headers: {{"content-type": "text/plain"}},
    body: JSON.stringify({{business_no: "FROM-A-PAGE"}}),
  }}),
]).then(() => {{ document.title = "sent"; }}, (e) => {{ document.title = "failed: " + e; }});
</script>
"""


class OtherSite:
    """Another site's page, served from its own port on 127.0.0.1."""

    def __init__(self, intake_url: str) -> None:
        page = PAGE.format(intake=intake_url).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self) -> OtherSite:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def test_a_page_on_another_port_cannot_pause_a_line_or_push_a_record(harness, browser):
    client = harness.start_intake()
    with OtherSite(str(client.base_url).rstrip("/")) as site:
        browser.get(site.url)
        wait(browser, lambda d: d.title != "loading", "the page's requests")
        assert browser.title == "sent", text_of(browser, "body")
    rows = client.get("/v1/lines").json()["lines"]
    assert [row["paused"] for row in rows if row["line"] == "order"] == [False]
    assert harness.record_count() == 0
    # The intake's own page and curl still act.
    assert client.post("/v1/lines/order/pause").is_success
