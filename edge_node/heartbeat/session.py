"""The paho side of the heartbeat: building the MQTT client, its jittered reconnect waits and
the few things paho offers no public API for (its wake-up socket pair, its queue of unsent
QoS 1 messages, a connection dropped without DISCONNECT).

paho is imported inside these functions, never at module import: a restarted edge answers
local inference before it heartbeats, and paho is a noticeable share of its imports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = [
    "close_wakeup_pair",
    "drop_stale_status",
    "first_reconnect_delay_s",
    "jitter_reconnect",
    "leave_without_disconnect",
    "new_client",
    "stop_loop",
]

log = logging.getLogger(__name__)


def first_reconnect_delay_s(broker: BrokerSettings) -> float:
    """paho's first wait after a lost connection, drawn anew each time in
    ``[reconnect_min_s / 2, reconnect_min_s]``; paho doubles it per failed attempt up to
    ``reconnect_max_s``. paho itself never jitters, so without this every edge that lost a
    restarted broker would reconnect at the same instants (the equal jitter of
    ``fleetwire.backoff``, which central's own reconnects use)."""
    return random.uniform(broker.reconnect_min_s / 2, broker.reconnect_min_s)


def jitter_reconnect(client: mqtt.Client, broker: BrokerSettings) -> None:
    """A new random first reconnect wait (``first_reconnect_delay_s``); paho starts
    its doubling from it. paho sleeps with time.sleep, so fractions of a second work."""
    client.reconnect_delay_set(first_reconnect_delay_s(broker), broker.reconnect_max_s)  # type: ignore[arg-type]


def new_client(node_id: str, settings: HeartbeatSettings, broker: BrokerSettings) -> mqtt.Client:
    """A clean-session MQTT 3.1.1 client of ``node_id``: credentials, TLS, the bound on
    queued QoS 1 messages and a connect timeout from the keepalive. No callbacks, no will."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    keepalive_s = broker.effective_keepalive_s(settings.default_keepalive_s)
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=broker.effective_client_id(f"edge-{node_id}"),
        clean_session=True,
        protocol=mqtt.MQTTv311,
    )
    if broker.username is not None:
        client.username_pw_set(broker.username, broker.password.get_secret_value() if broker.password else None)
    if broker.tls.enabled:
        client.tls_set_context(broker.tls.ssl_context())
    jitter_reconnect(client, broker)
    client.max_queued_messages_set(settings.max_queued_messages)
    client.connect_timeout = min(5.0, max(1.0, float(keepalive_s)))
    return client


def close_wakeup_pair(client: mqtt.Client) -> None:
    """Close the socket pair ``loop_start`` made (paho closes it only on GC, and makes a new
    one on every ``loop_start``)."""
    for name in ("_sockpairR", "_sockpairW"):
        pair = getattr(client, name, None)
        if pair is not None:
            with contextlib.suppress(OSError):
                pair.close()
            setattr(client, name, None)


def drop_stale_status(client: mqtt.Client, topics: Iterable[str]) -> None:
    """Forget unacknowledged messages of earlier connections on ``topics`` (status topics).

    paho resends queued QoS 1 messages after a reconnect even with a clean session,
    and it would do so after the new birth; paho has no public API for this."""
    out = getattr(client, "_out_messages", None)
    mutex = getattr(client, "_out_message_mutex", None)
    if out is None or mutex is None:
        return
    stale = set(topics)
    with mutex:
        for mid, message in list(out.items()):
            if message.topic in stale:
                del out[mid]


def leave_without_disconnect(client: mqtt.Client) -> None:
    """Drop the TCP connection without DISCONNECT, so the broker publishes the will."""
    sock = client.socket()
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


async def stop_loop(client: mqtt.Client, timeout_s: float, node_id: str) -> None:
    """Stop paho's network thread (bounded wait) and close its wake-up sockets."""
    try:
        await asyncio.wait_for(asyncio.to_thread(client.loop_stop), timeout=timeout_s)
    except TimeoutError:
        log.warning("paho thread of %s did not stop in time", node_id)
    close_wakeup_pair(client)
