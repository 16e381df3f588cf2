"""ReadTimeouts: a request's read timeout follows its model's observed p99 and its rows,
between a floor and a cap; an operator's per-model value wins; the rows come from the
request's JSON without decoding tensors."""

from __future__ import annotations

import orjson
import pytest

from central.gateway import StaticNodeSource, create_gateway
from central.gateway.timeouts import ReadTimeouts, request_rows
from central.settings import GatewaySettings


def test_unknown_models_have_no_timeout_and_known_ones_follow_their_p99() -> None:
    timeouts = ReadTimeouts(factor=4.0, floor_s=5.0, cap_s=120.0)
    assert timeouts.timeout_for("resnet", 1) is None  # no answer yet: the deadline bounds it
    for seconds in [2.5] * 2 + [1.5] * 98:
        timeouts.observe("resnet", seconds, rows=8)
    assert timeouts.timeout_for("resnet", 8) == pytest.approx(4.0 * 2.5)
    assert timeouts.timeout_for("resnet", 4) == pytest.approx(4.0 * 2.5)  # fewer rows: never below the p99's
    assert timeouts.timeout_for("resnet", 32) == pytest.approx(4.0 * 2.5 * 4)  # 4 × the usual rows
    assert timeouts.timeout_for("resnet", 10_000) == 120.0  # the cap


def test_a_fast_model_gets_the_floor_and_a_fixed_timeout_wins() -> None:
    timeouts = ReadTimeouts(factor=4.0, floor_s=5.0, cap_s=120.0, fixed={"llm": 300.0})
    for _ in range(50):
        timeouts.observe("mlp", 0.002, rows=1)
        timeouts.observe("llm", 1.0, rows=1)
    assert timeouts.timeout_for("mlp", 1) == 5.0
    assert timeouts.timeout_for("mlp", 1000) == 8.0  # 4 × 2 ms × 1000 rows
    assert timeouts.timeout_for("llm", 1) == 300.0
    assert timeouts.snapshot()["mlp"] == {"p99_s": 0.002, "usual_rows": 1.0, "read_timeout_s": 5.0}


def test_the_window_forgets_old_answers() -> None:
    timeouts = ReadTimeouts(factor=2.0, floor_s=1.0, cap_s=100.0, window=32)
    for _ in range(32):
        timeouts.observe("m", 10.0, rows=1)
    assert timeouts.timeout_for("m", 1) == 20.0
    for _ in range(32):
        timeouts.observe("m", 1.0, rows=1)
    assert timeouts.timeout_for("m", 1) == 2.0


def test_rows_come_from_the_shapes_of_json_and_binary_requests() -> None:
    json_body = orjson.dumps(
        {
            "inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [12, 128], "data": [0] * 1536},
                {"name": "mask", "datatype": "INT64", "shape": [12, 128], "data": [1] * 1536},
            ]
        }
    )
    assert request_rows(json_body, None) == 12
    header = b'{"inputs":[{"name":"x","datatype":"FP32","shape" : [ 256 ,3],"parameters":{"binary_data_size":3072}}]}'
    tensor = b'"shape":[999999]' + bytes(3072 - 16)  # binary data is never read as JSON
    assert request_rows(header + tensor, len(header)) == 256
    assert request_rows(b'{"inputs":[{"name":"x","shape":[],"data":[1]}]}', None) == 1
    assert request_rows(b"not json", None) == 1


def test_settings_reach_the_gateway() -> None:
    settings = GatewaySettings(read_timeout_floor_s=2.0, read_timeout_factor=3.0, model_timeouts={"big": 45.0})
    proxy = create_gateway(StaticNodeSource(), settings)
    assert proxy.timeouts.floor_s == 2.0 and proxy.timeouts.factor == 3.0
    assert proxy.timeouts.timeout_for("big", 1) == 45.0
    with pytest.raises(ValueError, match="greater than 0"):
        GatewaySettings(model_timeouts={"big": 0})
