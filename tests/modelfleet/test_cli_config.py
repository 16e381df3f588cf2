"""Where the CLI finds central: flags over environment over the config file."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_harness import Cli, one_error_line

from modelfleet.cli.config import CA_FILE_ENV, CENTRAL_ENV, CONFIG_ENV, TOKEN_ENV, ConfigError, load_config


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('central_url = "central.example:8080"\ntoken = "from-file"\n', encoding="utf-8")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    monkeypatch.delenv(CENTRAL_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(CA_FILE_ENV, raising=False)
    return path


def test_flags_beat_environment_beat_the_config_file(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config().model_dump() == {
        "central_url": "http://central.example:8080",
        "token": "from-file",
        "ca_file": None,
    }
    monkeypatch.setenv(CENTRAL_ENV, "https://env.example/")
    assert load_config().central_url == "https://env.example"
    assert load_config(central="127.0.0.1:9000", token="flag").model_dump() == {
        "central_url": "http://127.0.0.1:9000",
        "token": "flag",
        "ca_file": None,
    }


def test_without_any_setting_the_local_default_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (CONFIG_ENV, CENTRAL_ENV, TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    assert load_config().central_url == "http://127.0.0.1:8080"


def test_a_broken_config_file_is_a_usage_error(config_file: Path) -> None:
    config_file.write_text("central_url = [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config()
    config_file.write_text('central_url = "x"\nunknown_key = 1\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown_key"):
        load_config()


async def test_cli_exits_2_with_one_line_on_a_bad_config(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    Path(cli.env[CONFIG_ENV]).write_text("central_url = 3\n", encoding="utf-8")
    result = await cli("models")
    assert result.exit_code == 2
    assert "invalid central_url" in one_error_line(result)
