"""An embedded MQTT 3.1.1 broker (amqtt) for machines without Mosquitto.

Run as its own process (``python -m modelfleet.up.amqtt_broker --port N``) by
``modelfleet up``: amqtt then never shares an interpreter, an event loop or warning
filters with the fleet or with a test run. Anonymous, loopback only, retained messages
and Last Will (what the fleet's heartbeats need) work as in Mosquitto; no persistence.
Stops on SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

READY_LINE = "broker ready"


def broker_config(host: str, port: int) -> dict[str, Any]:
    """One TCP listener, anonymous clients, no $SYS topics or packet logging."""
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def serve(host: str, port: int) -> None:
    """Run the broker until SIGINT or SIGTERM."""
    from amqtt.broker import Broker

    broker = Broker(broker_config(host, port))
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"{READY_LINE} mqtt://{host}:{port}", flush=True)
    await stop.wait()
    await broker.shutdown()


def main(argv: list[str] | None = None) -> None:
    """Parse ``--host``/``--port`` and serve."""
    parser = argparse.ArgumentParser(prog="python -m modelfleet.up.amqtt_broker", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
