"""With operator auth on, every push, delete and rollout action in the event log names
the token that asked for it (its name, never the token); a refused write leaves no event."""

from __future__ import annotations

from pathlib import Path

import httpx

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from support.fleet import central_settings

AUDITED = {"model_pushed", "version_deleted", "rollout_started", "rollout_promoted", "rollout_rolled_back"}


async def test_operator_events_carry_the_token_name_and_never_the_token(tmp_path: Path, small_model_file: Path) -> None:
    data_dir = tmp_path / "central"
    store = TokenStore(data_dir / "tokens.json")
    tokens = {name: store.create(name, role) for name, role in (("alice", Role.ADMIN), ("bob", Role.ADMIN))}
    viewer = store.create("dash", Role.VIEWER)
    server = CentralServer(central_settings(data_dir, auth={"enabled": True}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api:

            async def call(who: str, method: str, path: str, **kwargs: object) -> httpx.Response:
                headers = {"Authorization": f"Bearer {tokens.get(who, viewer)}"}
                return await api.request(method, f"/api/v1/models/tiny{path}", headers=headers, **kwargs)  # type: ignore[arg-type]

            body = small_model_file.read_bytes()
            assert (await call("alice", "POST", "/versions", params={"version": "1"}, content=body)).status_code == 201
            streamed = await call(
                "alice",
                "POST",
                "/versions",
                params={"version": "2", "activate": "false", "progress": "ndjson"},
                content=body,
            )
            assert streamed.status_code == 200 and '"event":"result"' in streamed.text
            stored_only = {"version": "3", "activate": "false"}
            assert (await call("alice", "POST", "/versions", params=stored_only, content=body)).status_code == 201
            deleted = await call("bob", "DELETE", "/versions/2")  # not the latest, nor served
            assert deleted.status_code == 204, deleted.text
            assert (await call("bob", "POST", "/rollouts", json={"version": "3"})).status_code == 201
            assert (await call("bob", "POST", "/rollout/promote")).status_code == 200
            assert (await call("dash", "POST", "/rollback")).status_code == 403  # a viewer: no action, no event
            assert (await call("alice", "POST", "/rollback")).status_code == 200

            response = await api.get("/api/v1/events")  # reads stay open
            events = [e for e in response.json() if e["type"] in AUDITED]
            assert [(e["type"], e["actor"]) for e in events] == [
                ("model_pushed", "alice"),
                ("model_pushed", "alice"),
                ("model_pushed", "alice"),
                ("version_deleted", "bob"),
                ("rollout_started", "bob"),
                ("rollout_promoted", "bob"),
                ("rollout_rolled_back", "alice"),
            ]
            assert events[1]["detail"]["activate"] is False
            assert events[3]["detail"] == {"model": "tiny", "version": "2"}
    finally:
        await server.stop()
    on_disk = b"".join(p.read_bytes() for p in data_dir.glob("central.sqlite3*"))
    assert b"alice" in on_disk and b"rollout_rolled_back" in on_disk  # the audit trail is on disk ...
    for token in [*tokens.values(), viewer]:
        assert token not in response.text and token.encode() not in on_disk  # ... and no token anywhere
