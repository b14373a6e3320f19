"""Selectors: parsing and matching as PromQL does, with clear errors."""

from __future__ import annotations

import pytest

from hbmwatch.query import parse_selector
from hbmwatch.records import SeriesKey
from hbmwatch.validation import InvalidName, InvalidQuery


def test_parse_all_operators_and_escapes() -> None:
    s = parse_selector(r'gpu_power_watts{ host = "n\"1" , gpu!="0", rack=~"r[12]", sku!~"H.*" }')
    assert [(m.label, m.op.value, m.value) for m in s.matchers] == [
        ("host", "=", 'n"1'),
        ("gpu", "!=", "0"),
        ("rack", "=~", "r[12]"),
        ("sku", "!~", "H.*"),
    ]
    key = SeriesKey("gpu_power_watts", {"host": 'n"1', "gpu": "1", "rack": "r2", "sku": "MI300X"})
    assert s.matches(key)
    assert not s.matches(SeriesKey("gpu_power_watts", {"host": 'n"1', "gpu": "0"}))


def test_bare_metric_and_empty_braces() -> None:
    assert parse_selector("gpu_power_watts").matchers == ()
    assert parse_selector("gpu_power_watts{}").matchers == ()


def test_absent_label_matches_empty_string() -> None:
    s = parse_selector('gpu_power_watts{stack=""}')
    assert s.matches(SeriesKey("gpu_power_watts", {"gpu": "0"}))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("1metric", InvalidQuery),
        ('m{a="b"', InvalidQuery),
        ("m{a=b c}", InvalidQuery),
        ("m{a==x}", InvalidQuery),
        ('m{a=~"(a)\\1"}', InvalidQuery),
        ('m{a=~"("}', InvalidQuery),
        ('m{__name__="x"}', InvalidName),
        ('m{a=="x"}', InvalidQuery),
    ],
)
def test_bad_selectors_raise_clear_errors(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_selector(text)
