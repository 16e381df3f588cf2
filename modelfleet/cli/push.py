"""``modelfleet push``: upload a model with a real progress bar, then follow central's
steps (validate, quantize, accuracy guard, chunk, commit, place) as central reports
them (``?progress=ndjson``), and end with a summary of what the fleet will get."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from modelfleet.cli import output
from modelfleet.cli.client import CliError, JsonObject, PushRequest, connect
from modelfleet.cli.config import CentralOption, JsonOption, TokenOption
from modelfleet.cli.model_files import companion_files, data_files, graph_of

STEP_LABELS = {
    "validate": "validate (onnx.checker, signature)",
    "quantize": "quantize to INT8",
    "guard": "accuracy guard (INT8 vs FP32)",
    "chunk": "chunk and store",
    "manifest": "manifest and commit",
    "place": "place chunks on the ring",
}


def register(app: typer.Typer) -> None:
    """Add ``push`` to ``app``."""
    app.command()(push)


class PushView:
    """The upload bar and one spinner per server-side step, on one rich ``Progress``."""

    def __init__(self, console: Console, upload_bytes: int) -> None:
        self.progress = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._total = upload_bytes
        self._upload = self.progress.add_task("upload", total=upload_bytes, info="")
        self._steps: dict[str, TaskID] = {}

    def sent(self, n: int) -> None:
        """``n`` more bytes handed to the connection."""
        self.progress.advance(self._upload, n)
        done = self.progress.tasks[self._upload].completed
        self.progress.update(self._upload, info=f"{output.human_bytes(done)} / {output.human_bytes(self._total)}")

    def step(self, name: str, phase: str) -> None:
        """A step started or ended on central."""
        if phase == "start":
            label = STEP_LABELS.get(name, name)
            self._steps[name] = self.progress.add_task(label, total=None, info="")
        elif (task := self._steps.get(name)) is not None:
            self.progress.update(task, total=1, completed=1)

    def failed(self) -> None:
        """Mark the steps still running as the ones that failed."""
        for task in self.progress.tasks:
            if not task.finished and task.id != self._upload:
                self.progress.update(task.id, description=f"[red]✗ {task.description}", total=1, completed=0)
                self.progress.stop_task(task.id)


def _sizes(q: JsonObject) -> str:
    fp32, int8 = q.get("fp32_bytes"), q.get("int8_bytes")
    if not fp32 or not int8:
        return "-"
    return f"FP32 {output.human_bytes(fp32)} → INT8 {output.human_bytes(int8)} ({int8 / fp32:.0%})"


_MEASURES = {"top1": "top-1", "cosine": "cosine", "relative_error": "1 - relative error"}


def _agreement(q: JsonObject) -> str:
    if q.get("agreement") is None:
        return str(q.get("served_reason") or "-")
    metric = _MEASURES.get(str(q.get("metric")), str(q.get("metric")))
    bound = f", lower bound {q['lower_bound']:.2%}" if q.get("lower_bound") is not None else ""
    return (
        f"{q['agreement']:.2%} {metric}{bound} on {q.get('samples')} {q.get('samples_source', '')} samples "
        f"(threshold {output.percent(q.get('threshold'))}, decided by {metric})"
    )


def _candidates(q: JsonObject) -> str | None:
    """``int8-u8s8-qdq ✓ 1.4 s, int8-s8s8-qdq ✗ ...``: every recipe and its verdict."""
    found = q.get("candidates") or {}
    if not found:
        return None
    parts = []
    for name, c in found.items():
        guard = c.get("guard") or {}
        mark = "✓" if guard.get("passed") else "✗" if guard else "?"
        parts.append(f"{name} {mark} ({c.get('seconds', 0):.1f} s)")
    parts += [f"{name} failed" for name in q.get("failed_recipes") or {}]
    return ", ".join(parts)


def _accuracy(q: JsonObject) -> str | None:
    if q.get("fp32_accuracy") is None:
        return None
    return (
        f"FP32 {q['fp32_accuracy']:.2%} → INT8 {q['int8_accuracy']:.2%} "
        f"({-q['accuracy_delta_pp']:+.2f} pp) on the eval set"
    )


def _owners(placement: JsonObject) -> str:
    owners = placement.get("owners") or {}
    if not owners:
        return "no edge owns chunks yet: they are placed as edges join (or when the version is rolled out)"
    return ", ".join(f"{node} {count}" for node, count in owners.items())


def _served_note(q: JsonObject) -> list[tuple[str, str]]:
    """Why FP32 is served: INT8 failed, unproven (too few samples) or refused."""
    int8 = q.get("int8") or {}
    if int8.get("reason"):
        return [("served FP32", f"INT8 {int8['status']}: {int8['reason']}")]
    return [("note", str(q["served_reason"]))] if q.get("served_reason") else []


def _text_guard(q: JsonObject) -> list[tuple[str, str]]:
    """A language model's candidates: size, perplexity ratio and greedy agreement, verdict."""
    lines = []
    for name, c in (q.get("candidates") or {}).items():
        g = c.get("text_guard") or {}
        ppl, agree = g.get("perplexity_ratio") or {}, g.get("greedy_agreement") or {}
        mark = "✓" if g.get("passed") else "✗"
        lines.append((name, f"{mark} {output.human_bytes(c.get('bytes'))}, perplexity ×{ppl.get('value', 0):.3f}"
                      f" (≤ {ppl.get('upper_bound', 0):.3f}), greedy agreement {agree.get('value', 0):.1%}"
                      f" (≥ {agree.get('lower_bound', 0):.1%}), decided by {g.get('decided_by')}"))  # fmt: skip
    if q.get("served_reason"):
        lines.append(("note", str(q["served_reason"])))
    return lines


def summary(result: JsonObject, activate: bool) -> list[tuple[str, str]]:
    """The lines printed after a successful push."""
    m, report = result["manifest"], result.get("report", {})
    q = report.get("quantization")
    served = m.get("artifact", "fp32")
    lines = [("pushed", f"{m['name']}:{m['version']}, serving {served.upper()}")]
    if m.get("kind") == "decoder":
        lm = report.get("language_model") or {}
        lines.append(("language model", f"{lm.get('layers')} layers, vocabulary {lm.get('vocab_size')};"
                      " served by /v1/completions, /v1/chat/completions and generate"))  # fmt: skip
        lines += _text_guard(q) if q else []
    # What central changed so that ONNX Runtime loads the model (a newer opset or IR version).
    lines += [("converted", str(note)) for note in (report.get("compatibility") or {}).get("notes", [])]
    if q and q.get("family") == "decoder":
        pass  # the text guard's lines above
    elif q:
        lines += [("sizes", _sizes(q)), ("agreement", _agreement(q))]
        for key, text in (("candidates", _candidates(q)), ("accuracy", _accuracy(q))):
            if text:
                lines.append((key, text))
        lines += [("cleaned", str(c)) for c in (q.get("normalized") or {}).get("changes", [])]
        lines += _served_note(q)
    else:
        total = m.get("size", 0) + sum(f.get("size", 0) for f in m.get("files", []))
        lines.append(("sizes", f"FP32 {output.human_bytes(total)} (quantization is off on central)"))
    if m.get("files"):
        lines.append(("files", ", ".join(["model.onnx", *(f["path"] for f in m["files"])])))
    new = output.human_bytes(report.get("new_chunk_bytes"))
    lines.append(("chunks", f"{report.get('chunks', len(m.get('chunks', [])))} ({new} new to central)"))
    lines.append(("owners", _owners(result.get("placement") or {})))
    if not activate:
        lines.append(("activate", f"stored only; roll it out with: modelfleet rollout {m['name']} {m['version']}"))
    return lines


def _run(request: PushRequest, central: str | None, token: str | None, view: PushView | None) -> JsonObject:
    """Upload and follow the steps; the final result, or ``CliError`` with central's message."""
    with connect(central, token) as client:
        for event in client.push(request, view.sent if view else lambda _: None):
            kind = event.get("event")
            if kind == "step" and view is not None:
                view.step(str(event.get("step")), str(event.get("phase")))
            elif kind == "error":
                raise CliError(f"{event.get('error')} (HTTP {event.get('status')})")
            elif kind == "result":
                return event
    raise CliError("central closed the push without a result")


def _checked(path: Path, what: str) -> Path:
    if not path.is_file():
        output.usage(f"{what} {path} is not a file")
    return path


@output.reported
def push(
    model: Annotated[
        Path,
        typer.Argument(
            help="The ONNX model (its external-data files, and a language model's tokenizer, configs and chat"
            " template next to it are sent too), its folder, or a tar of its directory.",
            show_default=False,
        ),
    ],
    name: Annotated[str, typer.Option("--name", "-n", help="Model name in the registry.", show_default=False)],
    version: Annotated[str | None, typer.Option(help="Version label (default: the next number).")] = None,
    calibration: Annotated[Path | None, typer.Option(help=".npz of input arrays for INT8 calibration.")] = None,
    labels: Annotated[list[str] | None, typer.Option("--labels", "--label", help="key=value, repeatable.")] = None,
    fp32: Annotated[bool, typer.Option("--fp32", help="Serve FP32 if INT8 fails the accuracy guard.")] = False,
    require_int8: Annotated[
        bool,
        typer.Option(
            "--require-int8", help="Refuse the push when INT8 cannot be made or proven (default: serve FP32)."
        ),
    ] = False,
    eval_data: Annotated[
        Path | None,
        typer.Option("--eval", help=".npz of the model's inputs plus a 'label' array: the guard judges on it."),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Guard threshold for INT8's agreement with FP32 (lower bound, 0..1)."),
    ] = None,
    dims: Annotated[
        list[str] | None, typer.Option("--dim", help="name=size of a dynamic dimension (seq=128), repeatable.")
    ] = None,
    no_activate: Annotated[bool, typer.Option("--no-activate", help="Store only; roll out later.")] = False,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Push a model version: upload, validate, quantize, guard, chunk and place it."""
    graph = _checked(graph_of(model), "model")
    request = PushRequest(
        model=graph,
        data_files={**data_files(graph), **companion_files(graph)},
        name=name,
        version=version,
        calibration=_checked(calibration, "calibration file") if calibration else None,
        labels=labels or [],
        keep_fp32=fp32,
        require_int8=require_int8,
        activate=not no_activate,
        eval_data=_checked(eval_data, "eval file") if eval_data else None,
        threshold=threshold,
        dims=dims or [],
    )
    if json:
        output.print_json(_run(request, central, token, None))
        return
    console = output.console()
    view = PushView(console, sum(part.path.stat().st_size for part in request.parts()))
    with view.progress:
        try:
            result = _run(request, central, token, view)
        except CliError:
            view.failed()
            raise
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in summary(result, request.activate):
        grid.add_row(key, Text(value))
    console.print(grid)
