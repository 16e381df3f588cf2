"""``modelfleet zoo``: write the project's own models to files, for pushing by hand.

Models come from code, never from a hub: ``digits`` is a scikit-learn MLP trained on the
digits data set that ships with scikit-learn (with calibration samples for static INT8),
``mlp`` a random MLP of a chosen size (no meaningful accuracy: push it with ``--fp32``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from modelfleet.cli import output

zoo_app = typer.Typer(no_args_is_help=True, help="Write models built by code to files.")


def register(app: typer.Typer) -> None:
    """Add ``zoo`` to ``app``."""
    app.add_typer(zoo_app, name="zoo")


@zoo_app.command("digits")
@output.reported
def digits(
    out: Annotated[Path, typer.Option(help="Directory to write model.onnx and calibration.npz into.")],
) -> None:
    """The digits classifier (FP32 ONNX) and its calibration data."""
    from modelfleet.zoo import build_digits

    model = build_digits()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model.onnx_path, out / "model.onnx")
    shutil.copyfile(model.calibration_path, out / "calibration.npz")
    output.console().print(
        f"wrote {out / 'model.onnx'} and {out / 'calibration.npz'} "
        f"(FP32 test accuracy {model.fp32_test_accuracy:.4f}); push with\n"
        f"  modelfleet push {out / 'model.onnx'} --name digits --calibration {out / 'calibration.npz'}"
    )


@zoo_app.command("mlp")
@output.reported
def mlp(
    out: Annotated[Path, typer.Option(help="The .onnx file to write.")],
    width: Annotated[int, typer.Option(min=1, max=8192, help="Input and hidden width.")] = 256,
    layers: Annotated[int, typer.Option(min=0, max=64, help="Hidden layers.")] = 2,
    seed: Annotated[int, typer.Option(help="Weights seed: another seed, another version.")] = 0,
) -> None:
    """A random MLP, width inputs to 10 outputs (push it with --fp32: random weights have
    no accuracy for the INT8 guard to keep)."""
    from modelfleet.zoo import build_mlp

    out.parent.mkdir(parents=True, exist_ok=True)
    build_mlp(out, width=width, hidden_layers=layers, seed=seed)
    output.console().print(f"wrote {out} ({out.stat().st_size:,} bytes)")
