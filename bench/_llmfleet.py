"""The fleet every ``bench.generate_fleet`` section runs: Mosquitto, central and edges as
processes on loopback, heartbeats often so the waits end soon."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from bench._fleet import Fleet, chunking_env, parse_env_pairs
from modelfleet.up.mosquitto import BENCH_LOG, MosquittoBroker

__all__ = ["HEARTBEAT_S", "MODEL", "llm_fleet"]

#: The language model's name in every section.
MODEL = "llm"
#: Heartbeats (MQTT) carry each node's progress on a rollout; often, so the waits end soon.
HEARTBEAT_S = 0.5


@contextlib.contextmanager
def llm_fleet(args: argparse.Namespace, edges: int) -> Iterator[Fleet]:
    """A Mosquitto broker, central (quantization off: folders are served as pushed; the chunking
    bounds; ``--central-env``) and ``edges`` edges (``--edge-env``), all registered; stopped after."""
    with MosquittoBroker(log=BENCH_LOG) as broker:
        broker_env = {"MODELFLEET_BROKER__HOST": broker.host, "MODELFLEET_BROKER__PORT": str(broker.port)}
        central_env = {
            "MODELFLEET_QUANTIZE__ENABLED": "false",
            "MODELFLEET_MQTT__ENABLED": "true",
            "MODELFLEET_MQTT__DEFAULT_INTERVAL_S": str(HEARTBEAT_S),
            "MODELFLEET_ROLLOUT__INTERVAL_S": "0.2",
            **broker_env,
            **chunking_env(args.chunk_avg_kb),
            **parse_env_pairs(args.central_env),
        }
        edge_env = {
            "MODELFLEET_HEARTBEAT__ENABLED": "true",
            "MODELFLEET_HEARTBEAT__INTERVAL_S": str(HEARTBEAT_S),
            **broker_env,
            **parse_env_pairs(args.edge_env),
        }
        with Fleet(root=args.work_dir, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
            fleet.start(edges)
            yield fleet
