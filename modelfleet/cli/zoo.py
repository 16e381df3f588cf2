"""``modelfleet zoo``: write the project's own models to files, for pushing by hand.

Models come from code, never from a hub: ``digits`` is a scikit-learn MLP trained on the
digits data set that ships with scikit-learn (with calibration samples for static INT8),
``mlp`` a random MLP of a chosen size (no meaningful accuracy: push it with ``--fp32``).
``resnet``, ``transformer`` and ``external`` write real architectures: trained on digits
(small, with calibration and eval data) or at real sizes with random weights (for speed)."""

from __future__ import annotations

import shutil
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from modelfleet.cli import output

if TYPE_CHECKING:
    from modelfleet.zoo import ZooModel

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


class ResNetSize(StrEnum):
    """``zoo resnet --size``."""

    digits = "digits"
    full = "224"


class TransformerSize(StrEnum):
    """``zoo transformer --size`` and ``zoo external --size``."""

    small = "small"
    large = "large"


def _write(model: ZooModel, out: Path) -> None:
    """Copy ``model``'s files into ``out`` and say what they are and how to push them."""
    out.mkdir(parents=True, exist_ok=True)
    copied = [model.onnx_path, *model.data_files, model.calibration_path, model.eval_path]
    for path in copied:
        if path is not None:
            shutil.copyfile(path, out / path.name)
    console = output.console()

    def say(line: str) -> None:  # whole lines: a push command must survive copy and paste
        console.print(line, markup=False, soft_wrap=True)

    size = f"{model.size_bytes:,} bytes" + (f" in {len(model.files)} files" if model.data_files else "")
    accuracy = "random weights" if model.fp32_accuracy is None else f"FP32 accuracy {model.fp32_accuracy:.4f}"
    say(f"wrote {model.name} ({model.family}, {size}, {accuracy}) to {out}")
    for path in model.data_files:
        say(f"  {out / path.name}: external data; keep it next to model.onnx")
    push = f"modelfleet push {out / 'model.onnx'} --name {model.name}"
    if model.calibration_path is not None:
        push += f" --calibration {out / model.calibration_path.name}"
    if model.fp32_accuracy is None:
        push += " --fp32"
    if model.eval_path is not None:
        say(f"  {out / model.eval_path.name}: the held-out split, inputs and labels, for judging INT8")
        push += f" --eval {out / model.eval_path.name}"
    say(f"push with\n  {push}")


@zoo_app.command("resnet")
@output.reported
def resnet(
    out: Annotated[Path, typer.Option(help="Directory to write model.onnx and its data files into.")],
    size: Annotated[
        ResNetSize, typer.Option(help="digits: trained, 1x32x32; 224: ResNet-18's shape, random weights.")
    ] = ResNetSize.digits,
) -> None:
    """A ResNet-style CNN: trained on digits, or ResNet-18 at 3x224x224 for speed."""
    from modelfleet.zoo import build_resnet_digits, build_resnet_random

    _write(build_resnet_digits() if size is ResNetSize.digits else build_resnet_random(), out)


@zoo_app.command("transformer")
@output.reported
def transformer(
    out: Annotated[Path, typer.Option(help="Directory to write model.onnx and its data files into.")],
    size: Annotated[
        TransformerSize, typer.Option(help="small: trained on digits as tokens; large: MiniLM's shape, random.")
    ] = TransformerSize.small,
) -> None:
    """A BERT-style encoder classifier (INT64 input_ids and attention_mask, dynamic batch and length)."""
    from modelfleet.zoo import build_transformer_digits, build_transformer_random

    _write(build_transformer_digits() if size is TransformerSize.small else build_transformer_random(), out)


@zoo_app.command("external")
@output.reported
def external(
    out: Annotated[Path, typer.Option(help="Directory to write model.onnx and model.onnx.data into.")],
    size: Annotated[
        TransformerSize, typer.Option(help="small: the trained transformer; large: a random MLP of 2.25 GiB.")
    ] = TransformerSize.small,
) -> None:
    """A model shipped as ONNX external data (model.onnx + model.onnx.data)."""
    if size is TransformerSize.small:
        from modelfleet.zoo import build_transformer_digits_external

        _write(build_transformer_digits_external(), out)
        return
    from modelfleet.zoo.external import DATA_FILE, write_huge_mlp

    # Written straight into ``out`` (not via the cache): one copy of 2.25 GiB is enough.
    path = write_huge_mlp(out)
    total = path.stat().st_size + (out / DATA_FILE).stat().st_size
    output.console().print(
        f"wrote {path} and {out / DATA_FILE} ({total:,} bytes, random weights); push with\n"
        f"  modelfleet push {path} --name mlp-huge --fp32",
        markup=False,
        soft_wrap=True,
    )


def _layer_list(text: str) -> list[int]:
    """``--tune``'s layer indexes; a clear error on anything else."""
    try:
        return sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise typer.BadParameter(f"expected layer indexes like 3,9, got {text!r}", param_hint="--tune") from None


class LlmShape(StrEnum):
    """``zoo llm --shape``."""

    trained = "trained"
    tiny = "tiny"
    large = "200m"
    fleet = "500m"


@zoo_app.command("llm")
@output.reported
def llm(
    out: Annotated[Path, typer.Option(help="Directory to write the GenAI folder into (only the files a push takes).")],
    shape: Annotated[
        LlmShape,
        typer.Option(
            help="trained: a small Llama trained on Python's source; tiny, 200m: random weights, for speed;"
            " 500m: random weights, 2 GB, for distribution."
        ),
    ] = LlmShape.trained,
    eval_out: Annotated[
        Path | None, typer.Option(help="Where the trained model's held-out text goes (default: OUT.eval.txt).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Weights seed of a random shape: another seed, another version.")] = 0,
    tune: Annotated[
        str,
        typer.Option(
            help="Layers (e.g. 3,9) drawn from seed + 1, the rest as --seed draws them: a fine-tune of that"
            " version whose push moves only those layers' chunks."
        ),
    ] = "",
) -> None:
    """A Llama-architecture language model in ONNX Runtime GenAI's layout (model.onnx, model.onnx.data,
    genai_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    from modelfleet.zoo.llm import SHAPES, eval_text, trained_llm, trained_meta, write_random_llm

    console = output.console()

    def say(line: str) -> None:  # whole lines: a push command must survive copy and paste
        console.print(line, markup=False, soft_wrap=True)

    name = f"llm-{shape.value}"
    if shape is LlmShape.trained and tune:
        raise typer.BadParameter("redraws layers of a random shape, not of the trained model", param_hint="--tune")
    if shape is LlmShape.trained:
        shutil.copytree(trained_llm(), out, dirs_exist_ok=True)
        meta = trained_meta()
        about = f"trained, held-out perplexity {meta['heldout_perplexity']} (unigram {meta['unigram_perplexity']})"
    else:
        layers = _layer_list(tune)
        depth = SHAPES[shape.value].layers
        if any(i >= depth for i in layers):
            raise typer.BadParameter(f"{shape.value} has layers 0 to {depth - 1}, got {tune}", param_hint="--tune")
        write_random_llm(out, shape.value, seed=seed, layer_seeds={i: seed + 1 for i in layers})
        about = "random weights" + (f", layers {tune} from seed {seed + 1}" if layers else "")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    say(f"wrote {name} (decoder, {size:,} bytes, {about}) to {out}")
    push = f"modelfleet push {out} --name {name}"
    if shape is LlmShape.trained:
        eval_path = eval_out or out.with_name(f"{out.name}.eval.txt")
        eval_path.write_text(eval_text(), encoding="utf-8")
        say(f"  {eval_path}: held-out text, for judging INT4/INT8 weights")
        push += f" --eval {eval_path}"
    else:
        push += " --fp32"
    say(f"push with\n  {push}")
