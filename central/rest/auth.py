"""Who may call central's REST API: one ASGI middleware in front of every route.

With auth on, a write (any method but GET/HEAD/OPTIONS) needs an ``admin`` bearer token;
reads need a token of any role only with ``protect_reads``. The gateway (OIP ``/v2``, the
OpenAI-compatible ``/v1``) and ``/healthz`` stay open: inference clients and probes carry no
operator credential (an OpenAI client's ``api_key`` is no operator token). The
check runs before the route reads the body, so a refused push stores nothing. A browser may
show its token in a cookie instead, for reads only (``central.rest.browser_login``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from central.auth.tokens import Role, TokenRecord, operator_record
from central.rest import browser_login as browser
from central.storage.offload import StoreCalls
from central.storage.protocols import Tokens
from fleetwire.credentials import parse_bearer

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
_OPEN_PREFIXES = ("/v2/", "/v1/", "/healthz")
_UNAUTHORIZED = "missing or invalid token"
#: The actor of a request that showed no token (auth off, or an open route).
ANONYMOUS = "anonymous"


def actor_of(request: Request) -> str:
    """Who made ``request``: the name of its operator token (never the token), set by
    ``OperatorAuth``; ``ANONYMOUS`` when auth is off. Audit events carry it."""
    return str(getattr(request.state, "actor", ANONYMOUS))


def bearer(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, if any."""
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            return parse_bearer(value.decode("latin-1"))
    return None


def caller_token(scope: Scope) -> str | None:
    """The operator credential a request shows: its bearer token, else (reads only) the
    browser's cookie. Open routes that answer readers more (the gateway's catalog) check it."""
    token = bearer(scope)
    if token is None and not is_write(scope["method"]):
        token = browser.cookie_token(scope)
    return token


def is_write(method: str) -> bool:
    """Whether ``method`` changes something (needs an admin token when auth is on)."""
    return method not in _READS


def protects(method: str, path: str, protect_reads: bool) -> bool:
    """Whether ``method path`` needs a token: nothing under ``/v2``, ``/v1`` and ``/healthz``; elsewhere
    writes, and reads too with ``protect_reads`` (central's OpenAPI document declares 401/403 there)."""
    if path == "/v2" or path.startswith(_OPEN_PREFIXES):
        return False
    return is_write(method) or protect_reads


#: What ``stream_guard`` gives a stream: a check it repeats and the credential's name for its log.
StreamCheck = tuple[Callable[[], Awaitable[bool]], str]


def stream_guard(store: Tokens, calls: StoreCalls) -> Callable[[Request], StreamCheck | None]:
    """For a long response (the dashboard's event stream) that ``OperatorAuth`` let in with a
    credential: a check it repeats (is that token still an operator's? through ``calls``, off
    the event loop: PostgreSQL is a blocking call) and the token's name for its log. None for
    a request that showed no credential (reads open)."""

    def guard(request: Request) -> StreamCheck | None:
        token = caller_token(request.scope)
        if token is None:
            return None

        async def still_allowed() -> bool:
            return await calls(operator_record, store, token) is not None

        return still_allowed, f"token {actor_of(request)!r}"

    return guard


class OperatorAuth:
    """ASGI middleware: 401 without a known token, 403 for a viewer's write."""

    def __init__(self, app: ASGIApp, store: Tokens, calls: StoreCalls, protect_reads: bool = False) -> None:
        """``calls``: where token look-ups run (worker threads: a PostgreSQL store is a query)."""
        self.app = app
        self.store = store
        self._calls = calls
        self.protect_reads = protect_reads

    async def _operator(self, token: str | None) -> TokenRecord | None:
        return await self._calls(operator_record, self.store, token) if token is not None else None

    async def _caller(self, scope: Scope) -> TokenRecord | None:
        return await self._operator(caller_token(scope))  # a browser's cookie: reads only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            if scope.get("path") == browser.LOGIN_PATH:
                await self._login(scope, receive, send)
                return
            if scope.get("path") == browser.LOGOUT_PATH:
                await browser.logged_out(scope.get("scheme") == "https")(scope, receive, send)
                return
        if scope["type"] != "http" or not protects(scope["method"], scope.get("path", ""), self.protect_reads):
            await self.app(scope, receive, send)
            return
        caller = await self._caller(scope)
        if caller is None:
            if scope.get("path") == browser.DASHBOARD_PATH and scope["method"] == "GET":
                await browser.login_page()(scope, receive, send)  # a person in a browser: a form
                return
            headers = {"WWW-Authenticate": "Bearer"}
            await JSONResponse({"error": _UNAUTHORIZED}, status_code=401, headers=headers)(scope, receive, send)
            return
        method, path = scope["method"], scope.get("path", "")
        if is_write(method) and caller.role != Role.ADMIN:
            message = f"role {caller.role} may not {method} {path} (token {caller.name!r}; writes need admin)"
            await JSONResponse({"error": message}, status_code=403)(scope, receive, send)
            return
        scope.setdefault("state", {})["actor"] = caller.name  # request.state.actor, for the audit trail
        await self.app(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /dashboard/login``: a known operator token becomes the browser's cookie."""
        token = await browser.form_token(scope, receive)
        if token is None or await self._operator(token) is None:
            await browser.login_page("unknown or revoked token")(scope, receive, send)
            return
        await browser.logged_in(token, secure=scope.get("scheme") == "https")(scope, receive, send)
