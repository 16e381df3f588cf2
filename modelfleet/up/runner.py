"""``modelfleet up``: broker, central and edges as children, the digits model pushed and
served, a few requests through the gateway, the URLs printed; then either exit
(``--once``) or keep the fleet running until Ctrl-C or SIGTERM. Every path out, an
error or an interrupt included, stops every child first. With ``--ha`` central runs as
three replicas on a private PostgreSQL and S3 server (``modelfleet.up.ha``)."""

from __future__ import annotations

import contextlib
import signal
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from pydantic import BaseModel, Field, field_validator
from rich.console import Console
from rich.markup import escape

from modelfleet.extras import DEMO, MissingExtra, require_extra
from modelfleet.up import ha
from modelfleet.up.broker import BrokerChoice, RunningBroker, start_broker
from modelfleet.up.children import Child, ChildGroup, raising_on_sigterm
from modelfleet.up.datadir import DataDir
from modelfleet.up.demo import MODEL, Accuracy, DemoClient, Published, alive, serves
from modelfleet.up.errors import UpError
from modelfleet.up.ports import MAX_EDGES, PortPlan, available
from modelfleet.up.progress import Steps
from modelfleet.up.report import Fleet, print_urls, status_of
from modelfleet.up.secure import SecureFleet, prepare
from modelfleet.up.services import (
    Service,
    edge_ids,
    spawn_central,
    spawn_edges,
    wait_central,
    wait_edges,
)
from modelfleet.up.status import write
from modelfleet.zoo import DigitsModel, build_digits

__all__ = ["UpOptions", "run_up"]

_HTTP_TIMEOUT = httpx.Timeout(30.0, read=300.0)  # a push quantizes before it answers
_WATCH_S = 0.5


class UpOptions(BaseModel):
    """What ``modelfleet up`` was asked to do."""

    data_dir: Path = Field(Path(".modelfleet"), description="Registry, edge caches, logs; kept between runs.")
    edges: int = Field(3, ge=1, le=MAX_EDGES, description="How many edges to start.")
    base_port: int | None = Field(None, description="First port of the block to use; 0: free ports; None: defaults.")
    broker: BrokerChoice = Field("auto", description="auto: Mosquitto if installed, else the embedded amqtt.")
    once: bool = Field(False, description="Stop the fleet and exit once everything worked once.")
    json_status: Path | None = Field(None, description="Write URLs and ports here once the fleet is up.")
    timeout_s: float = Field(180.0, gt=0, description="Longest wait of any one step.")
    secure: bool = Field(
        False,
        description=(
            "Hardened fleet: a private CA and TLS everywhere (mutual between edges), operator and node tokens,"
            " MQTT logins and ACL over TLS; needs Mosquitto."
        ),
    )

    ha: bool = Field(
        False,
        description=(
            "Central as three replicas (central-1..3) sharing a private PostgreSQL and a bucket on a local"
            " S3 server; edges are given all three gRPC addresses. Needs the ha extra and PostgreSQL."
        ),
    )

    @field_validator("base_port")
    @classmethod
    def _base_port_fits(cls, value: int | None) -> int | None:
        PortPlan.build(1, value)  # raises ValueError with the allowed range
        return value


def run_up(options: UpOptions, steps: Steps) -> int:
    """Bring the fleet up, report, wait or exit; returns the exit code (0, 1, or 130)."""
    console = steps.console
    up = False
    try:
        # before anything starts (the model is built once the broker and central are starting);
        # SIGTERM ends ``up`` the way Ctrl-C does (children stopped first)
        require_extra("demo", "modelfleet up's demo", DEMO)
        if options.ha:
            ha.check_prerequisites()
        with raising_on_sigterm(lambda _: KeyboardInterrupt()), DataDir(options.data_dir) as data:
            group = ChildGroup(data.logs)
            shared = contextlib.ExitStack()  # --ha's PostgreSQL: closed once the replicas are stopped
            try:
                fleet = _bring_up(options, data, group, shared, steps)
                up = True
                print_urls(console, fleet, data)
                if options.json_status is not None:
                    _write_status(options.json_status, fleet, data)
                if not options.once:
                    console.print("[bold]The fleet is running; press Ctrl-C to stop it.[/bold]")
                    _watch(group, console)
            finally:
                _stop(group, shared, steps)
    except KeyboardInterrupt:
        return 0 if up else 130
    except (UpError, MissingExtra) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    return 0


def _bring_up(
    options: UpOptions, data: DataDir, group: ChildGroup, shared: contextlib.ExitStack, steps: Steps
) -> Fleet:
    secure = None
    if options.secure:
        with steps.step("credentials (CA and certificates, tokens, MQTT users)") as step:
            ids = ha.replica_ids() if options.ha else None  # one MQTT login and certificate each
            secure = prepare(data.root / "secure", data.root / "central", edge_ids(options.edges), ids)
            step.detail = f"in {secure.root}"
    broker, centrals, edges, model, state = _start(options, data, group, shared, steps, secure)
    central = centrals[0]  # the demo talks to the first replica; they share one registry
    try:
        with _http_client(secure) as client:
            api = DemoClient(client, central.http_url)
            ids = [e.name for e in edges]
            with steps.step(f"{len(ids)} edges heartbeating to central"):
                api.wait_nodes(ids, alive, "heartbeating", options.timeout_s, lambda: _check(group))
            with steps.step(f"push {MODEL} with its calibration data") as step:
                published = api.publish(model)
                step.detail = _published(published)
            version = api.latest_version()
            with steps.step(f"every edge serves {MODEL} v{version}"):
                serving = serves(version)
                api.wait_nodes(ids, serving, f"serving {MODEL} v{version}", options.timeout_s, lambda: _check(group))
            with steps.step("requests through the gateway") as step:
                api.wait_routable(model, options.timeout_s, lambda: _check(group))
                accuracy = api.measure(model)
                step.detail = _accuracy(accuracy)
    except httpx.HTTPError as exc:
        raise UpError(f"central at {central.http_url} did not answer: {exc!r} (log: {central.child.log_path})") from exc
    replicas = centrals if options.ha else []
    return Fleet(broker, central, edges, published, accuracy, secure, replicas=replicas, shared=state)


def _http_client(secure: SecureFleet | None) -> httpx.Client:
    """Plain HTTP; with ``--secure``, HTTPS trusting the fleet CA and the admin token."""
    if secure is None:
        return httpx.Client(timeout=_HTTP_TIMEOUT)
    context = ssl.create_default_context(cafile=str(secure.ca_file))
    headers = {"Authorization": f"Bearer {secure.admin_token}"}
    return httpx.Client(timeout=_HTTP_TIMEOUT, verify=context, headers=headers)


def _start(
    options: UpOptions,
    data: DataDir,
    group: ChildGroup,
    shared: contextlib.ExitStack,
    steps: Steps,
    secure: SecureFleet | None,
) -> tuple[RunningBroker, list[Service], list[Service], DigitsModel, ha.SharedState | None]:
    """Broker, central (or its replicas), edges; the model is built while central boots
    (they share no state)."""
    ports = PortPlan.build(options.edges, options.base_port)
    with steps.step("MQTT broker") as step:
        security = secure.broker if secure is not None else None
        broker = start_broker(group, options.broker, ports.broker, data.root / "broker", security=security)
        step.detail = f"{broker.kind} on {broker.url}{_moved(ports.broker, broker.port)}"
    # Central binds its gRPC port itself (0 when the planned one is taken) and names it in its
    # ready line; the edges start once it is known. Choosing a free port here and passing it on
    # lost a race now and then: another process took it before central bound it.
    if options.ha:
        with steps.step("PostgreSQL and S3 for the replicas") as step:
            state = shared.enter_context(ha.shared_state(group))
            step.detail = f"PostgreSQL on port {state.postgres.port}, bucket {state.bucket} on {state.s3.endpoint}"
            if secure is not None:
                ha.store_tokens(state, secure)
        secure_env = secure.central_env if secure is not None else None
        central_children = ha.spawn_replicas(group, ports, data.root, broker.address, state, secure_env=secure_env)
    else:
        state = None
        central_env = secure.central_env() if secure is not None else None
        grpc = available(ports.central_grpc)
        central_children = [spawn_central(group, ports, data.root, broker.address, grpc, central_env)]
    with steps.step(f"build the {MODEL} model (while central starts)") as step:
        model = build_digits()
        step.detail = f"{model.onnx_path.stat().st_size:,} bytes, FP32 test accuracy {model.fp32_test_accuracy:.1%}"
    centrals = _wait_centrals(central_children, ports, options, steps)
    # every replica's gRPC address: an edge moves to the next when the one it follows goes
    central_grpc = ",".join(c.grpc_address for c in centrals)
    edge_env = secure.edge_env if secure is not None else None
    edge_children = spawn_edges(group, ports, data.root, central_grpc, broker.address, edge_env)
    with steps.step(f"{options.edges} edges") as step:
        edges = wait_edges(edge_children, options.timeout_s)
        step.detail = ", ".join(
            f"{e.name} {e.http_url}{_moved(p, e.http_port)}" for e, p in zip(edges, ports.edge_http, strict=True)
        )
    return broker, centrals, edges, model, state


def _wait_centrals(children: list[Child], ports: PortPlan, options: UpOptions, steps: Steps) -> list[Service]:
    """Central's ready line, or every replica's (``--ha``); their addresses as the step's detail."""
    label = f"{len(children)} central replicas" if options.ha else "central"
    with steps.step(label) as step:
        if options.ha:
            centrals = ha.wait_replicas(children, options.timeout_s)
            step.detail = ", ".join(f"{c.name} {c.http_url} (gRPC {c.grpc_address})" for c in centrals)
        else:
            centrals = [wait_central(children[0], options.timeout_s)]
            step.detail = (
                f"HTTP {centrals[0].http_url}{_moved(ports.central_http, centrals[0].http_port)}, "
                f"gRPC {centrals[0].grpc_address}{_moved(ports.central_grpc, centrals[0].grpc_port)}"
            )
    return centrals


def _moved(wanted: int, got: int) -> str:
    return f" ({wanted} was taken)" if wanted and wanted != got else ""


def _published(p: Published) -> str:
    if p.pushed:
        return f"pushed as version {p.version}, served as {p.artifact}"
    return f"version {p.version} already on central (same bytes), not pushed again"


def _accuracy(a: Accuracy) -> str:
    return (
        f"accuracy {a.value:.1%} ({a.correct}/{a.total} held-out digits in {a.requests} requests,"
        f" answered by {', '.join(a.nodes)})"
    )


def _check(group: ChildGroup) -> None:
    """Raise for the first child that has exited."""
    for child in group.dead():
        raise child.died("while the fleet was starting")


def _write_status(path: Path, fleet: Fleet, data: DataDir) -> None:
    try:
        write(path, status_of(fleet, data))
    except OSError as exc:
        raise UpError(f"cannot write the status file {path}: {exc.strerror}") from exc


def _watch(group: ChildGroup, console: Console) -> None:
    """Until interrupted: report edges and central replicas that exit (the rest keeps serving);
    fail if the broker, the S3 server or a single central does."""
    reported: set[str] = set()
    while True:
        for child in group.dead():
            if not child.name.startswith(("edge-", "central-")):
                raise child.died("while the fleet was running")
            if child.name not in reported:
                reported.add(child.name)
                console.print(f"[yellow]warning:[/yellow] {escape(str(child.died()))}; the others keep serving")
        time.sleep(_WATCH_S)


def _stop(group: ChildGroup, shared: contextlib.ExitStack, steps: Steps) -> None:
    """Stop every child, then what they shared (``--ha``'s PostgreSQL); a second Ctrl-C
    meanwhile is ignored rather than leaving some running."""
    with _ignoring_interrupts():
        with steps.step("stop the fleet") as step:
            running = sum(c.alive() for c in group.children)
            group.stop()
            step.detail = f"{running} process{'es' if running != 1 else ''} stopped"
        shared.close()


@contextlib.contextmanager
def _ignoring_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
