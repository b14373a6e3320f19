"""Settings: defaults, TOML file, HBMWATCH_* variables, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hbmwatch.settings import load_settings
from hbmwatch.validation import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("HBMWATCH_") and not name.startswith("HBMWATCH_TEST"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults_are_local_and_safe() -> None:
    settings = load_settings()
    assert settings.api.host == "127.0.0.1"
    assert settings.store.url == "sqlite:///hbmwatch.db"  # a file in the working directory
    assert settings.api.write_token is None


def test_toml_file_then_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "custom.toml"
    config.write_text('[api]\nport = 9000\nhost = "0.0.0.0"\n[store]\nraw_retention_days = 3\n')
    settings = load_settings(config)
    assert (settings.api.port, settings.api.host, settings.store.raw_retention_days) == (
        9000,
        "0.0.0.0",
        3,
    )
    monkeypatch.setenv("HBMWATCH_API__PORT", "9100")
    assert load_settings(config).api.port == 9100


def test_hbmwatch_toml_in_working_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "hbmwatch.toml").write_text('[store]\nurl = "sqlite:///other.db"\n')
    assert load_settings().store.url == "sqlite:///other.db"


def test_config_env_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.toml"
    path.write_text('log_level = "debug"\n')
    monkeypatch.setenv("HBMWATCH_CONFIG", str(path))
    assert load_settings().log_level == "debug"


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[store]\nurl = "mysql://x"\nraw_retention_days = -1\n')
    with pytest.raises(ValidationError) as info:
        load_settings(config)
    text = str(info.value)
    assert "store.url" in text and "store.raw_retention_days" in text


def test_unknown_keys_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("[stor]\nurl = 'sqlite:///x.db'\n")
    with pytest.raises(ValidationError, match="stor"):
        load_settings(config)


def test_tokens_are_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HBMWATCH_API__WRITE_TOKEN", "s3cret-token")
    settings = load_settings()
    assert "s3cret-token" not in repr(settings) and "s3cret-token" not in str(settings.api)
    assert settings.api.write_token.get_secret_value() == "s3cret-token"
