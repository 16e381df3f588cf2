"""What each install brings, and that it is enough: the images' ``pip install`` lines, run
as virtualenvs holding exactly what those lines install (see ``installs.py``). The core
runs an edge, core plus ``[central,postgres]`` runs central (quantization included), a
replica on PostgreSQL and S3 too; neither has
the demo stack, and ``modelfleet up`` / ``zoo digits`` without ``[demo]`` say what to
install instead of failing halfway."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from deploy_checks import DEPLOY
from installs import distributions, make_venv

from modelfleet.up.children import ChildGroup
from modelfleet.up.s3server import S3Server
from modelfleet.up.services import Service, wait_central, wait_edges
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker

pytestmark = pytest.mark.fleet  # virtualenvs per image, central and edges run from them

#: Only ``modelfleet up``, the zoo's digits model, tests and benchmarks use these. (PyYAML is no
#: longer one: ``tokenizers``, which language models need, brings huggingface-hub, which needs it.)
DEMO_AND_DEV = {"scikit-learn", "scipy", "skl2onnx", "amqtt", "pytest", "hypothesis", "playwright"}
_PIP_INSTALL = re.compile(r"^RUN \S*pip install '?\.(?:\[(?P<extras>[\w,-]+)\])?'?$", re.M)
_READY_S = 90.0


def image_extras(dockerfile: str) -> tuple[str, ...]:
    """The extras the image's one ``pip install .`` line asks for."""
    (match,) = _PIP_INSTALL.finditer((DEPLOY / "docker" / dockerfile).read_text())
    return tuple(match["extras"].split(",")) if match["extras"] else ()


@pytest.fixture(scope="module")
def edge_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv with what the edge image installs."""
    return make_venv(tmp_path_factory.mktemp("edge-image") / "venv", image_extras("edge.Dockerfile"))


@pytest.fixture(scope="module")
def central_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv with what the central image installs."""
    return make_venv(tmp_path_factory.mktemp("central-image") / "venv", image_extras("central.Dockerfile"))


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes start outside the checkout, with no PYTHONPATH: they import what their venv holds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "")


def test_the_images_install_no_demo_or_dev_packages_and_only_central_gets_sympy_s3_and_postgres() -> None:
    edge = set(distributions(image_extras("edge.Dockerfile")))
    central = set(distributions(image_extras("central.Dockerfile")))
    assert edge & DEMO_AND_DEV == set()
    assert central & DEMO_AND_DEV == set()
    # obstore: chunks on S3 (blobs.bucket); psycopg: metadata on PostgreSQL (store.url), as replicas run;
    # onnx-ir: ORT's weight-only quantizer (a language model's INT4/INT8 candidates)
    assert central - edge == {"sympy", "mpmath", "obstore", "psycopg", "psycopg-binary", "psycopg-pool", "onnx-ir"}
    assert {"scikit-learn", "skl2onnx", "amqtt", "sympy"} <= set(distributions(["demo"]))


@pytest.mark.usefixtures("elsewhere")
def test_the_image_installs_run_central_and_an_edge_that_serves_a_pushed_model(
    tmp_path: Path, central_python: Path, edge_python: Path, mosquitto: MosquittoBroker
) -> None:
    group = ChildGroup(tmp_path / "logs")
    broker = ["--broker", f"127.0.0.1:{mosquitto.port}", "--http-port", "0", "--grpc-port", "0"]
    try:
        central_args = ["central", "--data-dir", str(tmp_path / "central"), *broker]
        central = wait_central(
            group.spawn("central", [str(central_python), "-m", "modelfleet", *central_args]), _READY_S
        )
        edge_dir = str(tmp_path / "edge-1")
        edge_args = ["edge", "--node-id", "edge-1", "--central", central.grpc_address, "--data-dir", edge_dir, *broker]
        (edge,) = wait_edges([group.spawn("edge-1", [str(edge_python), "-m", "modelfleet", *edge_args])], _READY_S)
        quantization = _push_and_infer(central, edge, build_mlp(tmp_path / "mlp.onnx", width=64, hidden_layers=1))
    finally:
        group.stop()
    assert quantization["method"] == "dynamic"
    assert quantization["preprocess"] == "full", quantization  # sympy: symbolic shape inference ran


@pytest.mark.usefixtures("elsewhere")
def test_the_central_image_install_runs_a_replica_on_postgres_and_s3(
    tmp_path: Path, central_python: Path, postgres_url: str, s3_server: S3Server
) -> None:
    """What the replicated Kubernetes layout runs: store.url, blobs.* and a replica id."""
    env = {"MODELFLEET_STORE__URL": postgres_url, **s3_server.blob_env(s3_server.new_bucket())}
    env["MODELFLEET_QUANTIZE__ENABLED"] = "false"
    group = ChildGroup(tmp_path / "logs")
    args = ["central", "--data-dir", str(tmp_path / "central"), "--http-port", "0", "--grpc-port", "0"]
    try:
        replica = group.spawn("central-r1", [str(central_python), "-m", "modelfleet", *args, "--replica-id", "r1"], env)
        central = wait_central(replica, _READY_S)
        with httpx.Client(base_url=central.http_url, timeout=60) as client:
            assert client.get("/healthz").status_code == 200
            model = build_mlp(tmp_path / "mlp.onnx", width=16, hidden_layers=1).read_bytes()
            pushed = client.post("/api/v1/models/mlp/versions", content=model)
            assert pushed.status_code == 201, pushed.text
    finally:
        group.stop()
    blobs = s3_server.client().list_objects_v2(Bucket=env["MODELFLEET_BLOBS__BUCKET"])
    assert blobs["KeyCount"] > 0  # the chunks went to the bucket, through obstore


def _push_and_infer(central: Service, edge: Service, model: Path) -> dict[str, object]:
    """Push ``model`` (INT8 quantized, FP32 served if the guard refuses a random MLP) and
    infer on the edge until it serves it; returns the push's quantization report."""
    with httpx.Client(timeout=60) as client:
        pushed = client.post(
            f"{central.http_url}/api/v1/models/mlp/versions", params={"keep_fp32": "true"}, content=model.read_bytes()
        )
        assert pushed.status_code == 201, pushed.text
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
        for _ in range(int(_READY_S / 0.2)):
            answer = client.post(f"{edge.http_url}/v2/models/mlp/infer", json=body)
            if answer.status_code == 200:
                break
            assert edge.child.alive(), edge.child.log_text()
            time.sleep(0.2)
        assert answer.status_code == 200, answer.text
    report: dict[str, object] = pushed.json()["manifest"]["quantization"]
    return report


@pytest.mark.usefixtures("elsewhere")
@pytest.mark.parametrize(
    ("args", "purpose", "missing"),
    [
        (
            ["up", "--once", "--base-port", "0", "--data-dir", "fleet"],
            "modelfleet up's demo",
            "sklearn, skl2onnx, amqtt",
        ),
        (["zoo", "digits", "--out", "digits"], "the digits model", "sklearn, skl2onnx"),
    ],
    ids=["up", "zoo-digits"],
)
def test_without_the_demo_extra_the_demo_commands_say_what_to_install(
    tmp_path: Path, central_python: Path, args: list[str], purpose: str, missing: str
) -> None:
    done = subprocess.run(
        [str(central_python), "-m", "modelfleet", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stdout + done.stderr
    expected = f"error: {purpose} needs the demo extra: pip install 'modelfleet[demo]' (missing: {missing})"
    assert done.stderr.strip() == expected
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing started, nothing written
