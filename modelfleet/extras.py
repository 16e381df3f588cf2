"""Optional dependencies (the extras of ``pip install 'modelfleet[…]'``) and the one check
that code needing one runs first.

A core install is what central, the edges and the operator CLI run. The demo stack is left
out: scikit-learn and skl2onnx train and export the digits model, amqtt is the embedded
broker of ``modelfleet up``. Code that needs them imports them lazily and calls
``require_extra`` first, so that a core install imports every module it ships and a user
who reaches for the demo gets one line saying what to install, not a traceback from deep
inside a step."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

__all__ = ["DEMO", "DIGITS_TRAINING", "MissingExtra", "require_extra"]

#: Training and exporting the digits model (``modelfleet zoo digits``, benchmarks, tests).
DIGITS_TRAINING = ("sklearn", "skl2onnx")
#: All of the ``demo`` extra, which ``modelfleet up`` asks for as a whole: the digits model
#: and amqtt, its broker where Mosquitto is not installed.
DEMO = (*DIGITS_TRAINING, "amqtt")


class MissingExtra(ImportError):
    """A feature needs an extra that is not installed; the message is the line to print."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def require_extra(extra: str, purpose: str, modules: Iterable[str]) -> None:
    """Raise ``MissingExtra`` unless every module in ``modules`` is installed.

    Looked up, not imported: amqtt, for one, must stay out of ``modelfleet up``'s own
    process (it runs in a child), and scikit-learn is imported by the step that needs it."""
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise MissingExtra(
            f"{purpose} needs the {extra} extra: pip install 'modelfleet[{extra}]' (missing: {', '.join(missing)})",
            name=missing[0],
        )
