"""``keel token create|list|revoke``: the bearer tokens of ``keel serve``'s API.

A token is printed once, when it is made; the store keeps only its SHA-256, so a lost
token cannot be shown again — revoke it and create another.
"""

from __future__ import annotations

from datetime import datetime

import typer
from rich.table import Table

from keel.cli.common import (
    JsonOption,
    StoreOption,
    console,
    err_console,
    keel_errors,
    print_json,
    shown,
    store_url,
)
from keel.runtime.api_tokens import hash_token, make_token
from keel.store.base import ApiToken
from keel.store.url import open_store

token_app = typer.Typer(help="Bearer tokens for the API of `keel serve`.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``token`` command group to ``app``."""
    app.add_typer(token_app, name="token")


@token_app.command("create")
@keel_errors
def create_command(
    name: str = typer.Argument(..., help="Who or what uses it: 1-64 of A-Z a-z 0-9 _ . @ -"),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Make a token and print it once (only its hash is stored)."""
    token = make_token()
    opened = open_store(store_url(store))
    try:
        made = opened.create_token(name, hash_token(token))
    finally:
        opened.close()
    if json_out:
        print_json({"name": made.name, "token": token, "created_at": _when(made.created_at)})
        return
    console.print(token, highlight=False, soft_wrap=True)
    err_console.print(
        f"token {shown(made.name)} created. It is shown this once and is not stored (only its "
        "SHA-256 is): keep it now. Send it as `Authorization: Bearer TOKEN`; "
        f"`keel token revoke {shown(made.name)}` withdraws it.",
        highlight=False,
        soft_wrap=True,
    )


@token_app.command("list")
@keel_errors
def list_command(json_out: bool = JsonOption, store: str | None = StoreOption) -> None:
    """Every token, oldest first, with when it was made and revoked (never the token)."""
    opened = open_store(store_url(store), must_exist=True)
    try:
        tokens = opened.list_tokens()
    finally:
        opened.close()
    if json_out:
        print_json([_token_json(token) for token in tokens])
        return
    if not tokens:
        console.print("no tokens: `keel token create NAME` makes one", highlight=False)
        return
    table = Table(show_edge=False, header_style="bold")
    for column in ("NAME", "CREATED", "REVOKED"):
        table.add_column(column)
    for token in tokens:
        table.add_row(shown(token.name), _when(token.created_at), _when(token.revoked_at) or "-")
    console.print(table)


@token_app.command("revoke")
@keel_errors
def revoke_command(
    name: str = typer.Argument(..., help="The live token to withdraw."),
    store: str | None = StoreOption,
) -> None:
    """Withdraw a token: requests carrying it are refused from the next one on."""
    opened = open_store(store_url(store), must_exist=True)
    try:
        revoked = opened.revoke_token(name)
    finally:
        opened.close()
    console.print(
        f"token {shown(revoked.name)} revoked at {_when(revoked.revoked_at)}; requests "
        "carrying it are refused from now on",
        highlight=False,
        soft_wrap=True,
    )


def _token_json(token: ApiToken) -> dict[str, str | None]:
    return {
        "name": token.name,
        "created_at": _when(token.created_at),
        "revoked_at": _when(token.revoked_at),
        "last_used_at": _when(token.last_used_at),
    }


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
