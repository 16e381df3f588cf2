"""Staged rollouts: ``rollout N V`` (``--dry-run``: its cost; ``--stage``/``--flip-at``: download
first, switch together), ``rollouts``, ``promote N``, ``flip N``, ``rollback N``.

A thin layer over central's rollout API (``/api/v1/models/{name}/rollouts`` …): the
CLI parses the operator's shorthand (``--canary 10%``, ``--selector zone=a``) and shows
where a rollout stands, including central's reason when it waits, is stuck or rolled
back."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.text import Text

from modelfleet.cli import output
from modelfleet.cli.client import JsonObject, UsageError, connect
from modelfleet.cli.config import CentralOption, JsonOption, TokenOption

_STATE_STYLE = {
    "staging": "yellow",
    "flipping": "cyan",
    "canary": "yellow",
    "rolling": "cyan",
    "complete": "green",
    "rolled_back": "red",
}
_NODE_STYLE = {"failed": "red", "refused": "red", "offline": "yellow"}


def register(app: typer.Typer) -> None:
    """Add the rollout commands to ``app``."""
    app.command()(rollout)
    app.command()(rollouts)
    app.command()(promote)
    app.command()(flip)
    app.command()(retry)
    app.command()(rollback)


_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` → seconds."""
    text = value.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :] or "s"
    try:
        seconds = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise UsageError(f"expected a duration like 90s, 30m or 2h, got {value!r}") from None
    if seconds <= 0:
        raise UsageError(f"a window lasts more than 0 s, got {value!r}")
    return seconds


def parse_window(value: str) -> JsonObject:
    """``zone=a|0 2 * * *|1h|Europe/Berlin`` (selector, cron, duration, time zone; the
    selector may be empty and the zone left out for UTC) → a maintenance window."""
    parts = [p.strip() for p in value.split("|")]
    if len(parts) not in (3, 4):
        raise UsageError(f"--window takes 'selector|cron|duration[|time zone]', got {value!r}")
    window: JsonObject = {
        "selector": parse_selector([parts[0]] if parts[0] else []),
        "cron": parts[1],
        "duration_s": parse_duration(parts[2]),
    }
    if len(parts) == 4:
        window["tz"] = parts[3]
    return window


def parse_instant(value: str) -> str:
    """An ISO 8601 instant as central takes it; one without a zone is this machine's local time."""
    try:
        instant = datetime.fromisoformat(value.strip())
    except ValueError:
        raise UsageError(f"expected an ISO 8601 time like 2026-12-04T02:00:00Z, got {value!r}") from None
    return (instant if instant.tzinfo is not None else instant.astimezone()).isoformat()


def parse_canary(value: str) -> float:
    """``10%`` → 0.1, ``0.25`` → 0.25; a fraction in (0, 1]."""
    text = value.strip()
    try:
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"--canary must be a percentage like 10% or a fraction like 0.1, got {value!r}") from None
    if not 0 < fraction <= 1:
        raise UsageError(f"--canary must be more than 0% and at most 100%, got {value!r}")
    return fraction


def parse_selector(pairs: list[str]) -> dict[str, str]:
    """``["zone=a", "tier=edge,gpu=yes"]`` → a label dict."""
    selector: dict[str, str] = {}
    for item in pairs:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"--selector takes key=value, got {pair!r}")
            selector[key.strip()] = value.strip()
    return selector


def describe(r: JsonObject) -> Text:
    """A few lines on where a rollout stands."""
    state = str(r.get("state", "?"))
    text = Text()
    text.append(f"rollout #{r.get('id')} of {r.get('model')}:{r.get('version')} ", style="bold")
    text.append(state, style=_STATE_STYLE.get(state, ""))
    text.append(f"  (from {r.get('previous_version') or 'nothing'})\n")
    targets, canaries = r.get("targets", []), r.get("canary_nodes", [])
    text.append(f"  selector {output.labels(r.get('selector'))}; {len(targets)} target node(s), ")
    if r.get("stage"):
        text.append(f"staged first, flip {'at ' + str(r['flip_at']) if r.get('flip_at') else 'on command'}\n")
    elif r.get("waves") is not None or r.get("rate_per_min") or r.get("windows"):
        sizes = r.get("wave_sizes") or []
        text.append(f"wave {int(r.get('wave', 0)) + 1} of {len(sizes)} (nodes per wave, cumulative: {sizes})")
        if r.get("rate_per_min"):
            text.append(f", at most {r['rate_per_min']:g} per minute")
        for w in r.get("windows") or []:
            text.append(f"\n  window {output.labels(w.get('selector'))}: '{w.get('cron')}' {w.get('tz')}")
            text.append(f" for {w.get('duration_s'):g} s")
        text.append("\n")
    else:
        text.append(f"canary {output.percent(r.get('canary'))} = {', '.join(canaries) or 'none'}\n")
        soak = r.get("soak_s")
        text.append(f"  promote: {'automatic after ' + format(soak, 'g') + ' s healthy' if soak else 'manual'}; ")
    text.append(f"abort above {output.percent(r.get('failure_threshold'))} failed after {r.get('min_nodes')} node(s)\n")
    staged = f"staged {r.get('staged', 0)}, " if r.get("stage") else ""
    text.append(f"  {staged}ready {r.get('ready', 0)}, failed {r.get('failed', 0)}")
    text.append(f" ({output.percent(r.get('failure_rate'))})")
    for node, node_state in sorted((r.get("nodes") or {}).items()):
        text.append(f"\n    {node}: ")
        text.append(str(node_state), style=_NODE_STYLE.get(str(node_state), ""))
        failure = (r.get("failures") or {}).get(node)
        if node_state in ("failed", "refused") and isinstance(failure, dict):
            text.append(f" ({failure.get('reason')}: {failure.get('error') or 'no message'})", style="red")
    if r.get("reason"):
        text.append(f"\n  {r['reason']}", style="italic")
    return text


def _show(result: JsonObject, json: bool) -> None:
    if json:
        output.print_json(result)
    else:
        output.console().print(describe(result))


@output.reported
def rollout(
    name: Annotated[str, typer.Argument(help="Model name.")],
    version: Annotated[str, typer.Argument(help="Stored version to roll out (push it with --no-activate).")],
    canary: Annotated[str, typer.Option(help="Share of the selected nodes that get it first: 10% or 0.1.")] = "10%",
    selector: Annotated[list[str] | None, typer.Option(help="Only nodes with these labels: key=value.")] = None,
    soak: Annotated[
        float | None, typer.Option(min=0, help="Promote by itself after this many healthy seconds.")
    ] = None,
    failure_threshold: Annotated[float, typer.Option(min=0, max=1, help="Roll back above this failed share.")] = 0.25,
    min_nodes: Annotated[int, typer.Option(min=1, help="Nodes that must report before the threshold counts.")] = 1,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Start nothing: show the bytes each node and site would fetch.")
    ] = False,
    stage: Annotated[
        bool, typer.Option("--stage", help="Download first: nodes hold the version and switch together at a flip.")
    ] = False,
    flip_at: Annotated[
        str | None, typer.Option("--flip-at", help="With --stage: when to switch (ISO 8601, central's clock).")
    ] = None,
    waves: Annotated[
        str | None, typer.Option(help="Cumulative waves, counts or shares of the targets: 1,10%,50% (then 100%).")
    ] = None,
    rate: Annotated[float | None, typer.Option(min=0.001, help="At most this many nodes switch per minute.")] = None,
    window: Annotated[
        list[str] | None,
        typer.Option(
            help="Maintenance window 'selector|cron|duration[|tz]', e.g. 'zone=a|0 2 * * *|1h|Europe/Berlin'."
        ),
    ] = None,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Start a staged rollout: canary nodes first, the rest after promote (or the soak time).
    With --stage, every node downloads and verifies it first and they switch together at
    --flip-at (or at `modelfleet flip`). With --dry-run, show what it would cost instead:
    bytes per node and site, from peers and from central, given what each node holds already."""
    body: JsonObject = {
        "version": version,
        "canary": parse_canary(canary),
        "selector": parse_selector(selector or []),
        "soak_s": soak,
        "failure_threshold": failure_threshold,
        "min_nodes": min_nodes,
        "stage": stage or flip_at is not None,
        "flip_at": parse_instant(flip_at) if flip_at is not None else None,
    }
    if waves is not None:
        body["waves"] = [w.strip() for w in waves.split(",") if w.strip()]
    if rate is not None:
        body["rate_per_min"] = rate
    if window:
        body["windows"] = [parse_window(w) for w in window]
    with connect(central, token) as client:
        if dry_run:
            preview = dict(
                client.request("POST", f"/api/v1/models/{name}/rollouts", params={"dry_run": "true"}, json=body)
            )
            if json:
                output.print_json(preview)
            else:
                show_preview(preview)
            return
        _show(client.start_rollout(name, body), json)


def show_preview(p: JsonObject) -> None:
    """The dry run's tables: per node, per site, then the totals and the model's assumptions."""
    b = output.human_bytes
    console = output.console()
    console.print(
        Text(
            f"dry run: {p.get('model')}:{p.get('version')} (from {p.get('previous_version') or 'nothing'})",
            style="bold",
        )
    )
    node_rows = [
        (
            str(n["node_id"]),
            str(n["site"]),
            "yes" if n["targeted"] else "seeds",
            b(n["bytes_total"]),
            b(n["bytes_from_own_site"]),
            b(n["bytes_from_other_sites"]),
            b(n["bytes_from_central"]),
            b(n["bytes_reused"]),
        )
        for n in p.get("nodes", [])
    ]
    columns = ("NODE", "SITE", "TARGET", "FETCH", "PEERS IN SITE", "PEERS ELSEWHERE", "CENTRAL", "HELD ALREADY")
    console.print(output.table(columns, node_rows) if node_rows else "no node would fetch anything")
    site_rows = [
        (
            str(s["site"]),
            str(s["nodes"]),
            b(s["bytes_total"]),
            b(s["bytes_from_own_site"]),
            b(s["bytes_in"]),
            b(s["bytes_from_central"]),
        )
        for s in p.get("sites", [])
    ]
    if site_rows:
        console.print(output.table(("SITE", "NODES", "FETCH", "INSIDE", "INTO SITE (WAN)", "FROM CENTRAL"), site_rows))
    t, targets = p.get("totals", {}), len(p.get("targets", []))
    console.print(
        f"total {b(t.get('bytes_total'))} on {t.get('nodes_fetching', 0)} node(s) of {targets} target(s):"
        f" {b(t.get('bytes_from_peers'))} from peers ({b(t.get('bytes_cross_site'))} across sites),"
        f" central egress {b(t.get('central_egress_bytes'))}"
    )
    if p.get("refused"):
        console.print(Text(f"a start would be refused now: {p['refused']}", style="red"))
    for line in p.get("assumptions", []):
        console.print(Text(f"  assumes {line}", style="italic"))


@output.reported
def rollouts(json: JsonOption = False, central: CentralOption = None, token: TokenOption = None) -> None:
    """Every rollout, newest first."""
    with connect(central, token) as client:
        found = client.rollouts()
    if json:
        output.print_json(found)
        return
    rows = [
        (
            str(r.get("id")),
            f"{r.get('model')}:{r.get('version')}",
            str(r.get("state")),
            f"{r.get('ready', 0)}/{len(r.get('targets', []))} ready, {r.get('failed', 0)} failed",
            str(r.get("reason") or ""),
        )
        for r in found
    ]
    columns = ("ID", "VERSION", "STATE", "PROGRESS", "REASON")
    output.console().print(output.table(columns, rows) if rows else "no rollouts yet")


@output.reported
def promote(
    name: Annotated[str, typer.Argument(help="Model name.")],
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Send a model's canary rollout on to every target node."""
    with connect(central, token) as client:
        _show(client.promote(name), json)


@output.reported
def flip(
    name: Annotated[str, typer.Argument(help="Model name.")],
    at: Annotated[
        str | None, typer.Option(help="When (ISO 8601, central's clock); default: as soon as it reaches them.")
    ] = None,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Switch a staged rollout's nodes together (or move the instant of a flip still ahead)."""
    with connect(central, token) as client:
        _show(client.flip(name, parse_instant(at) if at is not None else None), json)


@output.reported
def retry(
    name: Annotated[str, typer.Argument(help="Model name.")],
    node: Annotated[
        list[str] | None, typer.Option(help="Only these failed nodes (default: every failed node).")
    ] = None,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Count a rollout's failed nodes again; their edges retry on the new desired state."""
    with connect(central, token) as client:
        _show(client.retry(name, node or None), json)


@output.reported
def rollback(
    name: Annotated[str, typer.Argument(help="Model name.")],
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Send a model back to the version before its latest rollout."""
    with connect(central, token) as client:
        _show(client.rollback(name), json)
