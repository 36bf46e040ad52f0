"""API bearer tokens: how they are made and how the store recognises them.

A token is ``keel_`` followed by 43 URL-safe characters (256 random bits from
``secrets``). Only its SHA-256 (hex) is stored: the store can recognise a token it is
shown, never give one back. ``keel token create`` prints the token once.
"""

from __future__ import annotations

import hashlib
import re
import secrets

TOKEN_PREFIX = "keel_"
TOKEN_PATTERN = re.compile(r"keel_[A-Za-z0-9_-]{43}")


def make_token() -> str:
    """A fresh token: ``keel_`` + ``secrets.token_urlsafe(32)`` (43 characters)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The SHA-256 hex digest of ``token``: what the store keeps and looks up."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def well_formed(token: str) -> bool:
    """True when ``token`` has the shape ``make_token`` gives (checked before any lookup,
    so a malformed header costs no database query)."""
    return TOKEN_PATTERN.fullmatch(token) is not None
