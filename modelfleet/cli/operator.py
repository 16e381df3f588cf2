"""Read commands against central: ``models``, ``models show N``, ``models agreement N V``,
``nodes``, ``events``.

Each prints a table for people or, with ``--json``, the data for scripts."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from modelfleet.cli import output
from modelfleet.cli.client import CentralClient, CentralRefused, JsonObject, connect
from modelfleet.cli.config import CentralOption, JsonOption, TokenOption
from modelfleet.cli.rollout import describe

#: Events each --follow poll fetches; more than central logs in any one poll interval.
_FOLLOW_WINDOW = 1000

models_app = typer.Typer(help="Models in central's registry.", no_args_is_help=False)


def register(app: typer.Typer) -> None:
    """Add the read commands to ``app``."""
    app.add_typer(models_app, name="models")
    app.command()(nodes)
    app.command()(events)


@models_app.callback(invoke_without_command=True)
@output.reported
def models(
    ctx: typer.Context, json: JsonOption = False, central: CentralOption = None, token: TokenOption = None
) -> None:
    """List models: versions stored and the latest one."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(central, token) as client:
        found = client.models()
    if json:
        output.print_json(found)
        return
    rows = [
        (m["name"], _kind(m), m.get("latest") or "-", str(m["versions"]), _serves(m), output.when(m.get("created_at")))
        for m in found
    ]
    headers = ("MODEL", "KIND", "NEWEST", "VERSIONS", "SERVES", "CREATED")
    output.console().print(output.table(headers, rows) if rows else "no models yet")


def _kind(model: JsonObject) -> str:
    """``language model`` (served by the OpenAI API and OIP generate) or ``tensor``."""
    return "language model" if model.get("kind") == "decoder" else "tensor"


def _serves(model: JsonObject) -> str:
    """The newest version's served artifact, and why it is FP32 when INT8 could not be served."""
    artifact = str(model.get("artifact") or "-")
    reason = model.get("served_reason")
    return f"{artifact.upper()}: {reason}" if reason else artifact


def _rollout_or_none(client: CentralClient, name: str) -> JsonObject | None:
    """The model's latest rollout; None when it has none (or central has no rollouts)."""
    try:
        return client.rollout(name)
    except CentralRefused as exc:
        if exc.status == 404:
            return None
        raise


def _version_row(v: JsonObject) -> tuple[str, ...]:
    q = v.get("quantization") or {}
    served = v.get("artifact", "fp32")
    agreement = output.percent(q.get("agreement")) if q.get("agreement") is not None else "-"
    return (
        str(v["version"]),
        served,
        output.human_bytes(v.get("size")),
        str(v.get("chunks", "-")),
        agreement,
        output.labels(v.get("labels")),
        output.when(v.get("created_at")),
    )


@models_app.command("show")
@output.reported
def show(
    name: Annotated[str, typer.Argument(help="Model name.")],
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """One model: every version (served artifact, size, chunks, INT8 agreement) and its rollout."""
    with connect(central, token) as client:
        versions = client.versions(name)
        rollout = _rollout_or_none(client, name)
    if json:
        output.print_json({"name": name, "versions": versions, "rollout": rollout})
        return
    columns = ("VERSION", "ARTIFACT", "SIZE", "CHUNKS", "AGREEMENT", "LABELS", "CREATED")
    out = output.console()
    title = f"model {name}" + (" (language model)" if versions and versions[-1].get("kind") == "decoder" else "")
    out.print(output.table(columns, [_version_row(v) for v in versions], title=title))
    served_by = versions[-1].get("served_by") if versions else None
    if served_by:
        out.print(f"served by {', '.join(served_by)}")
    if rollout is not None:
        out.print(describe(rollout))


def _fraction(part: object, whole: object) -> str:
    return f"{int(part) / int(whole):.3f}" if isinstance(whole, int) and whole and isinstance(part, int) else "-"


def _agreement_row(node: str, n: JsonObject) -> tuple[str, ...]:
    shadow, verdict = n.get("shadow") or {}, n.get("verdict") or {}
    samples = shadow.get("samples", 0)
    measure = shadow.get("measure") or "-"
    mean = f"{shadow['measure_sum'] / samples:.4f}" if samples and shadow.get("measure_sum") is not None else "-"
    flag = "FLAGGED" if verdict.get("flagged") else ("ok" if verdict else "-")
    return (
        node, str(n.get("artifact", "")), str(samples), _fraction(shadow.get("top1_agree"), shadow.get("top1_samples")),
        f"{measure} {mean}", str(shadow.get("dropped", 0)), flag, str(n.get("serves", "")),
    )  # fmt: skip


@models_app.command("agreement")
@output.reported
def agreement(
    name: Annotated[str, typer.Argument(help="Model name.")],
    version: Annotated[str, typer.Argument(help="Version.")],
    clear: Annotated[bool, typer.Option("--clear", help="Forget its flags and fallbacks: INT8 served again.")] = False,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """INT8 against FP32 on live traffic: each node's sampled counts, the verdicts, the fallbacks,
    and the evidence for a pending INT8 candidate as it accumulates (promoted once proven)."""
    path = f"/api/v1/models/{name}/versions/{version}/agreement"
    with connect(central, token) as client:
        report = dict(client.request("DELETE" if clear else "GET", path))
    if json:
        output.print_json(report)
        return
    out = output.console()
    if clear:
        out.print(f"cleared {name}:{version} on {', '.join(report['cleared_nodes']) or 'no node'}")
        return
    columns = ("NODE", "ARTIFACT", "SAMPLES", "TOP-1", "MEASURE", "DROPPED", "VERDICT", "SERVES")
    rows = [_agreement_row(node, n) for node, n in sorted((report.get("nodes") or {}).items())]
    title = f"{name}:{version} on live traffic (policy {report.get('policy')})"
    pending = report.get("pending") or {}
    if rows or not pending:
        out.print(output.table(columns, rows, title=title) if rows else "no live samples reported yet")
    for artifact, evidence in sorted(pending.items()):
        nodes = evidence.get("nodes", len(evidence.get("per_node") or {}))
        out.print(f"pending {artifact} ({evidence.get('status')}, {nodes} node(s)): {evidence.get('reason', '-')}")
    for artifact, verdict in sorted((report.get("fleet") or {}).items()):
        out.print(f"pooled {artifact}: {verdict.get('reason')}")
    if report.get("fallback_nodes"):
        out.print(f"serving FP32 by central's fallback: {', '.join(report['fallback_nodes'])}")


def _merged_nodes(client: CentralClient) -> list[JsonObject]:
    """Registered nodes and heartbeat views, by node id (either may know a node alone)."""
    merged: dict[str, JsonObject] = {}
    for n in client.nodes():
        merged[n["node_id"]] = {**n, "state": "registered"}
    for v in client.membership().get("nodes", []):
        merged[v["node_id"]] = {**merged.get(v["node_id"], {}), **v}
    return [merged[k] for k in sorted(merged)]


def _load(load: JsonObject | None) -> str:
    if not load:
        return "-"
    return f"{load.get('inflight', 0)} in flight, {load.get('rps', 0):.1f} rps, p99 {load.get('p99_ms', 0):.1f} ms"


def _cache(cache: JsonObject | None) -> str:
    if not cache:
        return "-"
    lookups = cache.get("hits", 0) + cache.get("misses", 0)
    hits = f", {cache.get('hits', 0) / lookups:.0%} hits" if lookups else ""
    used = output.human_bytes(cache.get("bytes"))
    return f"{used} / {output.human_bytes(cache.get('capacity'))}{hits}" if cache.get("capacity") else used + hits


def _speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def artifact_line(model: JsonObject) -> str | None:
    """``mlp:1 int8-u8s8-qdq 1.93x/1.71x (fastest of 3 on this node)``: the artifact a node serves
    a version as, its speed-up over FP32 at batch 1/batch 8, and why; None before it is known."""
    c = model.get("choice")
    if not c:
        return None
    speed = ""
    if c.get("speedup_b1") is not None or c.get("speedup_b8") is not None:
        speed = f" {_speedup(c.get('speedup_b1'))}/{_speedup(c.get('speedup_b8'))}"
    return f"{model['name']}:{model['version']} {c['artifact']}{speed} ({c.get('reason') or c.get('source')})"


def _held(m: JsonObject) -> str:
    """``name:version state`` (why, when failed), and a language model's engine now (tokens/s,
    running, waiting)."""
    held = f"{m['name']}:{m['version']} {m['state']}"
    if m["state"] == "failed" and m.get("reason"):
        held += f" ({m['reason']})"
    g = m.get("generation")
    if not g:
        return held
    return (
        f"{held} (language model: {g.get('tokens_per_s', 0):.1f} tok/s, {g.get('running', 0)} running, "
        f"{g.get('waiting', 0)} waiting)"
    )


def _node_row(n: JsonObject) -> tuple[str, ...]:
    models = n.get("models", [])
    refused = n.get("refused") or []  # central's: the node's runtime cannot load them
    versions = ", ".join(_held(m) for m in [*models, *refused]) or "-"
    artifacts = "; ".join(line for m in models if (line := artifact_line(m))) or "-"
    return (
        n["node_id"],
        str(n.get("state", "-")),
        output.age(n.get("last_heartbeat_age_s")),
        _load(n.get("load")),
        versions,
        str(n.get("hardware_class") or "-"),
        artifacts,
        _cache(n.get("cache")),
        str(n.get("owned_chunks", "-")),
    )


@output.reported
def nodes(json: JsonOption = False, central: CentralOption = None, token: TokenOption = None) -> None:
    """Nodes: state, last heartbeat, load, versions held, hardware class, the artifact each
    version is served as (speed-up over FP32 at batch 1/8, and why), cache and chunks owned."""
    with connect(central, token) as client:
        found = _merged_nodes(client)
    if json:
        output.print_json(found)
        return
    columns = ("NODE", "STATE", "HEARTBEAT", "LOAD", "VERSIONS", "CLASS", "ARTIFACT", "CACHE", "CHUNKS")
    out = output.console()
    out.print(output.table(columns, [_node_row(n) for n in found]) if found else "no nodes have joined yet")


def _event_line(e: JsonObject) -> str:
    detail = " ".join(f"{k}={v}" for k, v in sorted(e.get("detail", {}).items()) if v is not None)
    node = f" {e['node_id']}" if e.get("node_id") else ""
    return f"{output.clock(e.get('ts'))}  {e['type']}{node}  {detail}".rstrip()


def _print_event(e: JsonObject, json: bool) -> None:
    if json:
        output.print_json_line(e)
    else:
        output.console().print(_event_line(e), markup=False, soft_wrap=True)


def _key(e: JsonObject) -> str:
    return f"{e.get('ts')}|{e.get('type')}|{e.get('node_id')}|{sorted(e.get('detail', {}).items())}"


def _follow(client: CentralClient, seen: set[str], json: bool, interval: float) -> None:
    """Poll for new events until Ctrl-C (which the caller turns into exit 0)."""
    while True:
        time.sleep(interval)
        for e in client.events(_FOLLOW_WINDOW):
            if (k := _key(e)) not in seen:
                seen.add(k)
                _print_event(e, json)


@output.reported
def events(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="How many past events to show.")] = 50,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between polls with --follow.")] = 1.0,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Fleet events, oldest first: nodes alive/suspect/dead, failovers, rollouts."""
    with connect(central, token) as client:
        # With --follow, the window that later polls compare against is the one shown from.
        recent = client.events(max(limit, _FOLLOW_WINDOW) if follow else limit)
        if json and not follow:
            output.print_json(recent)
            return
        for e in recent[-limit:]:
            _print_event(e, json)
        if not follow:
            return
        try:
            _follow(client, {_key(e) for e in recent}, json, interval)
        except KeyboardInterrupt:
            return
