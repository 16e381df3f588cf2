"""``modelfleet generate`` and ``modelfleet chat``: text from a language model, over the
OpenAI-compatible API every edge serves (``/v1/completions``, ``/v1/chat/completions``).

Both talk to ``--url`` (an edge's HTTP address, or any server of that API), else
``MODELFLEET_URL``, else central's address from the usual flags, environment and config file
(central routes the API to its edges once it serves it). ``--stream`` prints tokens as they
come (server-sent events); ``chat`` always streams and keeps the conversation's history."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import typer

from modelfleet.cli import output
from modelfleet.cli.client import CliError
from modelfleet.cli.config import CentralOption, TokenOption, load_config

URL_ENV = "MODELFLEET_URL"

UrlOption = Annotated[
    str | None,
    typer.Option("--url", help=f"The OpenAI-compatible server (an edge) [env {URL_ENV}; default: central].",
                 show_default=False),
]  # fmt: skip
MaxTokens = Annotated[int, typer.Option("--max-tokens", min=1, max=1_000_000, help="Most tokens to generate.")]
Temperature = Annotated[float, typer.Option(min=0.0, help="0 for greedy decoding.")]
Seed = Annotated[int | None, typer.Option(help="Same seed, same tokens.")]


def register(app: typer.Typer) -> None:
    """Add ``generate`` and ``chat`` to ``app``."""
    app.command("generate")(generate)
    app.command("chat")(chat)


class TextClient:
    """The few calls of the OpenAI-compatible API the two commands make, errors in words."""

    def __init__(self, url: str | None, central: str | None, token: str | None) -> None:
        config = load_config(central, token)
        base = (url or os.environ.get(URL_ENV) or config.central_url).rstrip("/")
        self.url = base if "://" in base else f"http://{base}"
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        verify: Any = str(config.ca_file) if config.ca_file else True
        self._http = httpx.Client(base_url=self.url, headers=headers, verify=verify,
                                  timeout=httpx.Timeout(30.0, read=None))  # fmt: skip

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def complete(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed answer."""
        response = self._call("POST", path, body)
        return dict(response.json())

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks of a streamed answer, until ``[DONE]``."""
        try:
            with self._http.stream("POST", path, json={**body, "stream": True}) as response:
                if response.status_code >= 400:
                    response.read()
                    raise CliError(_refusal(response, self.url))
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield json.loads(data)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.url}: {exc}") from None

    def _call(self, method: str, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.url}: {exc}") from None
        if response.status_code >= 400:
            raise CliError(_refusal(response, self.url))
        return response


def _refusal(response: httpx.Response, url: str) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    return f"{url} refused ({response.status_code}): {message}"


def _sampling(max_tokens: int, temperature: float, seed: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
    return body if seed is None else {**body, "seed": seed}


@output.reported
def generate(
    model: Annotated[str, typer.Argument(help="A language model the server serves.")],
    prompt: Annotated[str, typer.Argument(help="The text to continue.")],
    max_tokens: MaxTokens = 64,
    temperature: Temperature = 0.0,
    seed: Seed = None,
    stream: Annotated[bool, typer.Option("--stream", help="Print tokens as they come.")] = False,
    url: UrlOption = None,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Continue PROMPT with MODEL (``/v1/completions``)."""
    client = TextClient(url, central, token)
    body = {"model": model, "prompt": prompt, **_sampling(max_tokens, temperature, seed)}
    out = output.console()
    try:
        if stream:
            for chunk in client.stream("/v1/completions", body):
                for choice in chunk.get("choices", []):
                    out.print(choice.get("text", ""), end="", markup=False, highlight=False, soft_wrap=True)
            out.print()
            return
        answer = client.complete("/v1/completions", body)
        out.print(answer["choices"][0]["text"], markup=False, highlight=False, soft_wrap=True)
        usage = answer.get("usage") or {}
        why = answer["choices"][0].get("finish_reason")
        out.print(f"[dim]{usage.get('completion_tokens')} tokens, finish_reason {why}[/dim]")
    finally:
        client.close()


@output.reported
def chat(
    model: Annotated[str, typer.Argument(help="A language model the server serves.")],
    system: Annotated[str | None, typer.Option(help="A system prompt for the conversation.")] = None,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.7,
    seed: Seed = None,
    url: UrlOption = None,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Talk with MODEL (``/v1/chat/completions``, streamed); an empty line or end of input ends it."""
    client = TextClient(url, central, token)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    out = output.console()
    try:
        while True:
            try:
                said = input("> ")
            except EOFError:
                break
            if not said.strip():
                break
            messages.append({"role": "user", "content": said})
            body = {"model": model, "messages": messages, **_sampling(max_tokens, temperature, seed)}
            reply = []
            for chunk in client.stream("/v1/chat/completions", body):
                for choice in chunk.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content") or ""
                    reply.append(piece)
                    out.print(piece, end="", markup=False, highlight=False, soft_wrap=True)
            out.print()
            messages.append({"role": "assistant", "content": "".join(reply)})
    finally:
        client.close()
