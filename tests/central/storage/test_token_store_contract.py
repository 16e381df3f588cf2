"""The token store's contract on both backends, the JSON file and PostgreSQL: a token is
shown once and only its sha256 is stored, names are unique per store, a node token is bound
to one node, revocation is immediate, and operator and node tokens never mix."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from central.auth.tokens import Role, TokenKind, TokenStoreError, hash_token
from central.storage.files.tokens import TokenStore
from central.storage.protocols import Tokens
from central.storage.tokens import open_token_store


@pytest.fixture(params=["file", pytest.param("postgres", marks=pytest.mark.fleet)])
def url(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("postgres_url") if request.param == "postgres" else None


@pytest.fixture
def opened(url: str | None, tmp_path: Path) -> Iterator[dict[TokenKind, Tokens]]:
    stores: dict[TokenKind, Tokens] = {
        "operator": open_token_store(url, tmp_path / "tokens.json", "operator"),
        "node": open_token_store(url, tmp_path / "node_tokens.json", "node"),
    }
    yield stores
    for store in stores.values():
        store.close()


def _stored_text(url: str | None, tmp_path: Path) -> str:
    """Everything the backend holds, as text (to look for a plaintext token)."""
    if url is None:
        return "".join(p.read_text() for p in tmp_path.glob("*.json"))
    import psycopg

    with psycopg.connect(url) as conn:
        return repr(conn.execute("SELECT * FROM api_tokens").fetchall())


def test_only_the_hash_is_stored_and_a_token_checks_until_revoked(
    opened: dict[TokenKind, Tokens], url: str | None, tmp_path: Path
) -> None:
    operators = opened["operator"]
    admin = operators.create("ci", Role.ADMIN)
    viewer = operators.create("dash", Role.VIEWER)
    stored = _stored_text(url, tmp_path)
    assert admin not in stored and viewer not in stored and hash_token(admin) in stored
    record = operators.verify(admin)
    assert record is not None and (record.name, record.role, record.node_id) == ("ci", Role.ADMIN, None)
    assert operators.verify(admin + "x") is None
    assert sorted(r.name for r in operators.records()) == ["ci", "dash"]

    with pytest.raises(TokenStoreError, match="exists already"):
        operators.create("ci", Role.VIEWER)
    operators.revoke("ci")
    assert operators.verify(admin) is None
    assert operators.verify(viewer) is not None
    with pytest.raises(TokenStoreError, match="no token named 'ci'"):
        operators.revoke("ci")


def test_node_tokens_are_bound_and_kept_apart_from_operator_tokens(opened: dict[TokenKind, Tokens]) -> None:
    nodes, operators = opened["node"], opened["operator"]
    with pytest.raises(TokenStoreError, match="needs a node id"):
        nodes.create("edge-a", Role.NODE)
    with pytest.raises(TokenStoreError, match="only a node token"):
        operators.create("ci", Role.ADMIN, node_id="edge-a")
    a1 = nodes.create("edge-a-1", Role.NODE, node_id="edge-a")
    a2 = nodes.create("edge-a-2", Role.NODE, node_id="edge-a")
    b = nodes.create("edge-b", Role.NODE, node_id="edge-b")
    operators.create("edge-a-1", Role.ADMIN)  # the same name in the other store is another token
    assert operators.verify(a1) is None, "a node token is no operator token"
    record = nodes.verify(a1)
    assert record is not None and record.node_id == "edge-a"

    assert sorted(nodes.revoke_node("edge-a")) == ["edge-a-1", "edge-a-2"]
    assert nodes.verify(a1) is None and nodes.verify(a2) is None and nodes.verify(b) is not None
    assert [r.name for r in operators.records()] == ["edge-a-1"]
    with pytest.raises(TokenStoreError, match="no token for node 'edge-a'"):
        nodes.revoke_node("edge-a")


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    """Threads switching every microsecond, so races between checks show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("frequent_switches")
def test_file_store_checked_from_many_threads_never_keeps_a_revoked_token(tmp_path: Path) -> None:
    """Checks run on worker threads, each re-reading a changed file: while another process
    (the CLI: its own store) revokes token after token, the records kept always belong to
    the stamp kept, so once a revocation is on disk no thread's check accepts the token."""
    path = tmp_path / "tokens.json"
    cli, served = TokenStore(path), TokenStore(path)
    tokens = [cli.create(f"t{i}", Role.VIEWER) for i in range(40)]
    stop = threading.Event()
    start = threading.Barrier(5)

    def check() -> None:
        start.wait()
        while not stop.is_set():
            for token in tokens:
                served.verify(token)

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    start.wait()
    try:
        for i, token in enumerate(tokens):
            cli.revoke(f"t{i}")
            assert served.verify(token) is None, f"t{i} accepted after its revocation"
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert served.records() == []
