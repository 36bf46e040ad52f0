"""The console's shell and assets as a real ``keel serve`` sends them (no browser needed).

Open without a token (they hold no data), with a strict Content-Security-Policy; only
the shipped files are served; every asset stays on this origin and builds the page
without parsing HTML from strings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

import keel.server.console as console

STATIC = Path(console.__file__).parent / "static"
ASSETS = sorted(p.name for p in STATIC.iterdir() if p.is_file())
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'"
)

KeelServer = Any  # tests/browser/conftest.py's KeelServer (a conftest is not importable)


def test_the_shell_page_is_open_and_locked_down(keel_server: KeelServer) -> None:
    response = httpx.get(f"{keel_server.url}/", timeout=10)

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["content-security-policy"].startswith(CSP)
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["cache-control"] == "no-cache"
    assert "set-cookie" not in response.headers
    assert '<script type="module" src="/static/app.js">' in response.text


@pytest.mark.parametrize("name", [n for n in ASSETS if n != "index.html"])
def test_every_asset_is_served_with_its_type_and_the_same_headers(
    keel_server: KeelServer, name: str
) -> None:
    response = httpx.get(f"{keel_server.url}/static/{name}", timeout=10)

    assert response.status_code == 200, response.text
    kind = {"js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
    assert response.headers["content-type"] == f"{kind}; charset=utf-8"
    assert response.headers["content-security-policy"].startswith(CSP)
    assert response.content == (STATIC / name).read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/static/missing.js",
        "/static/..%2Fconsole.py",
        "/static/%2e%2e%2fapp.py",
        "/static/.hidden.js",
        "/static/",
        "/favicon.ico",
    ],
)
def test_nothing_but_the_shipped_assets_is_served(keel_server: KeelServer, path: str) -> None:
    response = httpx.get(f"{keel_server.url}{path}", timeout=10)

    assert response.status_code in (401, 404), (path, response.status_code)
    assert "json" in response.headers["content-type"]  # an error, never a file's bytes


def test_the_assets_ask_nothing_of_another_origin_and_parse_no_html() -> None:
    imports: set[str] = set()
    for name in ASSETS:
        text = (STATIC / name).read_text()
        # The SVG namespace is a name, not a request.
        outside = re.findall(
            r"(?:https?:)?//[\w.-]+\.\w+", text.replace("http://www.w3.org/2000/svg", "")
        )
        assert [u for u in outside if not u.startswith("//")] == [], (name, outside)
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert banned not in text, (name, banned)
        imports.update(re.findall(r'from "\./([\w.-]+)"', text))
    assert imports <= set(ASSETS), imports - set(ASSETS)  # every module import is shipped
