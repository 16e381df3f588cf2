"""The CLI against a central serving HTTPS with a certificate from a private CA: it
verifies the certificate, trusts that CA through MODELFLEET_CA_FILE (or ``ca_file`` in
its config file), and says so in one line when it does not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cli_harness import Cli, one_error_line

from central.server import CentralServer
from modelfleet.cli.config import CA_FILE_ENV
from support.certs import CertAuthority
from support.fleet import central_settings


@pytest.fixture
def pki(tmp_path: Path) -> CertAuthority:
    return CertAuthority(tmp_path / "pki")


@pytest.fixture
async def https_central(tmp_path: Path, pki: CertAuthority) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", tls=pki.issue("central").tls()))
    await server.start()
    yield server
    await server.stop()


async def test_the_cli_reaches_an_https_central_only_when_it_trusts_its_ca(
    tmp_path: Path, https_central: CentralServer, pki: CertAuthority
) -> None:
    cli = Cli(tmp_path, https_central.http_url)
    refused = await cli("models")
    assert refused.exit_code == 1
    line = one_error_line(refused)
    assert "certificate verify failed" in line.lower() and CA_FILE_ENV in line

    cli.env[CA_FILE_ENV] = str(pki.ca_file)
    trusted = await cli("models", "--json")
    assert trusted.exit_code == 0, trusted.stderr
    assert trusted.stdout.strip() == "[]"


async def test_ca_file_in_the_config_file_and_a_missing_one_is_a_usage_error(
    tmp_path: Path, https_central: CentralServer, pki: CertAuthority
) -> None:
    cli = Cli(tmp_path, https_central.http_url)
    Path(cli.env["MODELFLEET_CONFIG"]).write_text(f'ca_file = "{pki.ca_file}"\n', encoding="utf-8")
    assert (await cli("models", "--json")).exit_code == 0

    cli.env[CA_FILE_ENV] = str(tmp_path / "missing-ca.pem")
    result = await cli("models")
    assert result.exit_code == 2
    assert "invalid ca_file" in one_error_line(result)
