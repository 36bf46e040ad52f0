"""The web console: the shell page at ``/`` and its assets at ``/static/<name>``.

These are the only routes open without a token: the page and its scripts hold no data.
Everything the console shows it fetches from the API with the token the person typed in.
Only files that ship in ``keel/server/static`` are served, by exact name (no paths, so
nothing outside that folder is reachable). Every response carries a strict
Content-Security-Policy (scripts, styles and connections to this origin only; no
framing), ``nosniff`` and ``no-referrer``; ``Cache-Control: no-cache`` makes a browser
revalidate, so an upgraded server never runs with yesterday's script.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).parent / "static"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

router = APIRouter(include_in_schema=False)


def _asset(name: str) -> FileResponse:
    """The shipped file ``name`` with the console's headers; 404 for anything else."""
    path = STATIC_DIR / name
    media_type = MEDIA_TYPES.get(path.suffix)
    if "/" in name or "\\" in name or name.startswith(".") or media_type is None:
        raise HTTPException(status_code=404, detail=f"no console asset named {name!r}")
    if not path.is_file():
        raise HTTPException(status_code=404, detail=f"no console asset named {name!r}")
    return FileResponse(path, media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/")
def console_page() -> FileResponse:
    """The console's single page; it routes by the URL's hash (#/runs, #/tasks)."""
    return _asset("index.html")


@router.get("/static/{name}")
def console_asset(name: str) -> FileResponse:
    """One of the console's scripts or style sheets."""
    return _asset(name)
