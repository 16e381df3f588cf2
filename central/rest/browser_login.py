"""A browser on a ``protect_reads`` dashboard: a page load and an ``EventSource`` cannot carry
an ``Authorization`` header, so the page's token travels in a cookie instead.

``GET /dashboard`` without a credential answers a small login form (401); posting it to
``POST /dashboard/login`` checks the token and sets it as the cookie ``modelfleet_token``:
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page makes the
browser send it), ``Secure`` under HTTPS, gone when the browser closes. The cookie counts for
reads only — a write always needs the ``Authorization`` header, so a page elsewhere cannot
make a logged-in browser change anything — and it is checked against the token store on
every request like a header: a revoked token stops working at once.
``POST /dashboard/logout`` clears it."""

from __future__ import annotations

import html
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import Receive, Scope

COOKIE = "modelfleet_token"
DASHBOARD_PATH = "/dashboard"
LOGIN_PATH = "/dashboard/login"
LOGOUT_PATH = "/dashboard/logout"
#: A login form is a token and little else; a larger body is not one.
_MAX_FORM_BYTES = 4096

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>modelfleet — sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family: system-ui, sans-serif; max-width: 32rem; margin: 4rem auto">
<h1>modelfleet dashboard</h1>
<p>This central requires a token to read (<code>auth.protect_reads</code>). Paste an operator token
(<code>modelfleet token create --name NAME --role viewer</code>); it is kept in a cookie until the browser closes.</p>
{message}
<form method="post" action="/dashboard/login">
<input type="password" name="token" autocomplete="off" placeholder="mft_…" required style="width: 100%">
<p><button type="submit">Open the dashboard</button></p>
</form></body></html>
"""


def cookie_token(scope: Scope) -> str | None:
    """The token in the request's ``modelfleet_token`` cookie, if any."""
    for key, value in scope.get("headers", []):
        if key == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:  # a malformed Cookie header carries no token
                continue
            if COOKIE in jar and jar[COOKIE].value:
                return jar[COOKIE].value
    return None


def login_page(message: str | None = None, status: int = 401) -> Response:
    """The login form (401: this is what a read without a credential gets in a browser)."""
    shown = f'<p role="alert" style="color: #b00">{html.escape(message)}</p>' if message else ""
    headers = {"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"}
    return HTMLResponse(_PAGE.format(message=shown), status_code=status, headers=headers)


async def form_token(scope: Scope, receive: Receive) -> str | None:
    """The ``token`` field of a posted login form, or None (another body, or too large)."""
    content_type = dict(scope.get("headers", [])).get(b"content-type", b"").decode("latin-1")
    if not content_type.startswith("application/x-www-form-urlencoded"):
        return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > _MAX_FORM_BYTES:
            return None
        if not message.get("more_body", False):
            break
    values = parse_qs(body.decode("latin-1"), max_num_fields=8).get("token", [""])
    return values[0].strip() or None


def logged_in(token: str, secure: bool) -> Response:
    """303 to the dashboard, setting the cookie."""
    response = RedirectResponse(DASHBOARD_PATH, status_code=303, headers={"Cache-Control": "no-store"})
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/")
    return response


def logged_out(secure: bool) -> Response:
    """303 to the dashboard (its login form), clearing the cookie."""
    response = RedirectResponse(DASHBOARD_PATH, status_code=303)
    response.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=secure, path="/")
    return response
