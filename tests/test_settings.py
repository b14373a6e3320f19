"""Settings: defaults, TOML file, HBMWATCH_* variables, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hbmwatch.settings import load_settings
from hbmwatch.validation import ConfigError, parse_duration


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


def test_bad_values_name_the_file_section_and_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[store]\nurl = "mysql://x"\nraw_retention_days = -1\n')
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    text = str(info.value)
    assert f"{config}: [store] url: store.url must be a sqlite:///" in text
    assert f"{config}: [store] raw_retention_days: Input should be greater than 0 (got -1)" in text
    assert "\n" not in text


def test_unknown_sections_are_refused_with_the_closest_name(tmp_path: Path) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("[stor]\nurl = 'sqlite:///x.db'\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert str(info.value) == f"{config}: [stor]: unknown section; did you mean [store]?"


@pytest.mark.parametrize(
    ("toml", "where", "hint"),
    [
        ('[store]\nurll = "sqlite:///x.db"', "[store] urll", "did you mean url?"),
        ("[api]\nprot = 9000", "[api] prot", "did you mean port?"),
        ("[collector]\ninterval_second = 2", "[collector] interval_second",
         "did you mean interval_seconds?"),
        ("[simulator]\nbase_prot = 0", "[simulator] base_prot", "did you mean base_port?"),
        ("[detection]\nenable = false", "[detection] enable", "did you mean enabled?"),
        ("[alerts]\ngroup_second = 60", "[alerts] group_second", "did you mean group_seconds?"),
        ('[[collector.targets]]\nkind = "dme"\nurl = "http://h:5000/metrics"\nlabel = {}',
         "[collector] targets[0].label", "did you mean labels?"),
        ('[[alerts.receivers]]\nname = "am"\nkind = "webhook"\nurl = "http://h/"\ntimeout = 3',
         "[alerts] receivers[0].timeout", "did you mean timeout_seconds?"),
        ("loglevel = 'debug'", "loglevel", "did you mean log_level?"),
        ("[store]\nzzzz = 1", "[store] zzzz", "known keys: compaction_grace_seconds, "),
    ],
)  # fmt: skip
def test_unknown_keys_in_every_section_are_refused(
    tmp_path: Path, toml: str, where: str, hint: str
) -> None:
    config = tmp_path / "typo.toml"
    config.write_text(toml + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert str(info.value).startswith(f"{config}: {where}: unknown key; {hint}")


def test_unknown_keys_in_the_environment_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HBMWATCH_STORE__URLL", "sqlite:///x.db")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == (
        "HBMWATCH_STORE__URLL: [store] urll: unknown key; did you mean HBMWATCH_STORE__URL?"
    )
    monkeypatch.delenv("HBMWATCH_STORE__URLL")
    monkeypatch.setenv("HBMWATCH_STOR__URL", "sqlite:///x.db")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == (
        "HBMWATCH_STOR__URL: unknown section stor; did you mean HBMWATCH_STORE__URL?"
    )


def test_other_tools_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """HBMWATCH_PG_PASSWORD and friends (compose, CI) have no double underscore: not judged."""
    monkeypatch.setenv("HBMWATCH_PG_PASSWORD", "x")
    monkeypatch.setenv("HBMWATCH_WRITE_TOKEN", "x")
    assert load_settings().api.port == 8427


def test_bad_environment_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HBMWATCH_API__PORT", "eighty")
    with pytest.raises(ConfigError, match=r"^HBMWATCH_API__PORT: \[api\] port: Input should be"):
        load_settings()


def test_errors_never_echo_urls_or_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HBMWATCH_STORE__URL", "mysql://hbm:s3cret-pw@db/hbm")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "s3cret-pw" not in str(info.value) and "[store] url" in str(info.value)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("[store\n")
    with pytest.raises(ConfigError, match=f"^{config}: not valid TOML: "):
        load_settings(config)


def test_tokens_are_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HBMWATCH_API__WRITE_TOKEN", "s3cret-token")
    settings = load_settings()
    assert "s3cret-token" not in repr(settings) and "s3cret-token" not in str(settings.api)
    assert settings.api.write_token.get_secret_value() == "s3cret-token"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("1h30m", 5400), ("1h 30m", 5400), ("1.5h", 5400),
     ("250ms", 0.25), ("1m500ms", 60.5), ("2d", 172_800), ("1w", 604_800), ("1d12h", 129_600),
     ("1y", 31_536_000), ("2w3d4h5m6s", 1_483_506), (12, 12), (0.5, 0.5)],
)  # fmt: skip
def test_durations_in_prometheus_spelling(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "30m1h", "1hh", "d", "-5m", "1e3", True])
def test_bad_durations_name_the_units(text: str | bool) -> None:
    with pytest.raises(ValueError, match=r"is not a duration: use .*units y, w, d, h, m, s, ms"):
        parse_duration(text)


def test_durations_must_be_finite_and_not_negative() -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_duration(float("inf"))
    with pytest.raises(ValueError, match="negative"):
        parse_duration(-1)
