"""Where central is and how to authenticate: ``--central``/``--token`` flags first, then
``MODELFLEET_CENTRAL_URL``/``MODELFLEET_TOKEN``/``MODELFLEET_CA_FILE``, then a TOML file
(``$MODELFLEET_CONFIG``, default ``~/.config/modelfleet/config.toml``)::

    central_url = "https://central.example:8443"
    token = "…"
    ca_file = "/etc/modelfleet/fleet-ca.pem"   # a private CA to trust for https

Operators script the CLI from several machines; one file per machine and an
environment override per shell keeps the commands themselves short."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

DEFAULT_CENTRAL_URL = "http://127.0.0.1:8080"
CENTRAL_ENV = "MODELFLEET_CENTRAL_URL"
TOKEN_ENV = "MODELFLEET_TOKEN"
CA_FILE_ENV = "MODELFLEET_CA_FILE"
CONFIG_ENV = "MODELFLEET_CONFIG"

CentralOption = Annotated[
    str | None,
    typer.Option(
        "--central",
        help=f"Central's REST address [env {CENTRAL_ENV}; config file; default {DEFAULT_CENTRAL_URL}].",
        show_default=False,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", help=f"Bearer token for central [env {TOKEN_ENV}; config file].", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


class ConfigError(Exception):
    """The configuration cannot be used (a usage problem: exit 2)."""


class CliConfig(BaseModel):
    """The resolved connection settings of one CLI invocation."""

    model_config = ConfigDict(extra="forbid")

    central_url: str = DEFAULT_CENTRAL_URL
    """Base URL of central's REST API; ``host:port`` alone means ``http://host:port``."""
    token: str | None = None
    """Sent as ``Authorization: Bearer …`` when set."""
    ca_file: Path | None = None
    """PEM CA bundle trusted for an ``https`` central (a private fleet CA) instead of the
    system's; the server's host name is verified either way."""

    @field_validator("central_url")
    @classmethod
    def _with_scheme(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value:
            raise ValueError("must not be empty")
        return value if "://" in value else f"http://{value}"

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value


def config_path() -> Path:
    """The config file this invocation reads (it need not exist)."""
    explicit = os.environ.get(CONFIG_ENV)
    return Path(explicit) if explicit else Path.home() / ".config" / "modelfleet" / "config.toml"


def _from_file(path: Path) -> dict[str, object]:
    if not path.is_file():
        if os.environ.get(CONFIG_ENV):
            raise ConfigError(f"config file {path} (from {CONFIG_ENV}) does not exist")
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


def load_config(central: str | None = None, token: str | None = None) -> CliConfig:
    """Flags over environment over the config file over defaults; ``ConfigError`` when invalid."""
    path = config_path()
    values = _from_file(path)
    choices = (("central_url", CENTRAL_ENV, central), ("token", TOKEN_ENV, token), ("ca_file", CA_FILE_ENV, None))
    for key, env, flag in choices:
        chosen = flag if flag is not None else os.environ.get(env)
        if chosen is not None:
            values[key] = chosen
    try:
        return CliConfig.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise ConfigError(f"invalid {where} (flags, environment or {path}): {first['msg']}") from None
