"""One line per step of ``modelfleet up``, with how long it took; a spinner while it runs
(on a terminal only: in a log or a pipe the finished lines are all there is)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

__all__ = ["Step", "Steps"]


@dataclass
class Step:
    """A running step; set ``detail`` to say what it found."""

    title: str
    detail: str = ""


class Steps:
    """Prints ``✓ title — detail (1.2 s)`` when a step ends, ``✗ title (1.2 s)`` when it fails."""

    def __init__(self, console: Console) -> None:
        self.console = console

    @contextmanager
    def step(self, title: str) -> Iterator[Step]:
        """Run the ``with`` body as one step."""
        current = Step(title)
        started = time.monotonic()
        try:
            with self.console.status(escape(title) + " …"):
                yield current
        except BaseException:
            self._line("[red]✗[/red]", current, started)
            raise
        self._line("[green]✓[/green]", current, started)

    def _line(self, mark: str, step: Step, started: float) -> None:
        detail = f" — {escape(step.detail)}" if step.detail else ""
        elapsed = time.monotonic() - started
        self.console.print(f"{mark} {escape(step.title)}{detail} [dim]({elapsed:.1f} s)[/dim]", highlight=False)
