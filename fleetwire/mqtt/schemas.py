"""Writes (or checks) the committed JSON Schemas of every MQTT payload.

``python -m fleetwire.mqtt.schemas`` rewrites ``fleetwire/schemas/*.json``;
``--check`` exits 1 when they differ from the models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from fleetwire.mqtt.payloads import CentralStatus, Event, Heartbeat, NodeStatus

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
MODELS: dict[str, type[BaseModel]] = {
    "node_status": NodeStatus,
    "heartbeat": Heartbeat,
    "central_status": CentralStatus,
    "event": Event,
}


def render(model: type[BaseModel]) -> str:
    """The schema text of one payload model, stable for diffs."""
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schemas, or with ``--check`` compare them."""
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, model in MODELS.items():
        path = SCHEMA_DIR / f"{name}.schema.json"
        text = render(model)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale JSON Schemas: {', '.join(stale)} (run python -m fleetwire.mqtt.schemas)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
