"""One matcher grammar and one regex engine (RE2) for selectors, silences and inhibit rules."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from hbmwatch.alerts import matchers as alert_matchers
from hbmwatch.api.main import create_app
from hbmwatch.matchers import parse_matcher, parse_matchers, quote
from hbmwatch.query import Selector, parse_selector
from hbmwatch.records import Sample, SeriesKey
from hbmwatch.settings import InhibitRuleSettings
from hbmwatch.store.store import Store
from hbmwatch.validation import InvalidQuery
from tests.test_alerts_engine import gpu
from tests.test_api import TEMP, settings_for

#: The issue's regex: exponential backtracking in Python's ``re`` on any value without a z.
HOSTILE = "................(.|.)*z"


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


@pytest.mark.parametrize(
    ("text", "triple"),
    [
        ("host=n1", ("host", "=", "n1")),
        ('host="n1"', ("host", "=", "n1")),
        ("rack=~r[0-3]", ("rack", "=~", "r[0-3]")),
        ('alertname!~"GPU.*|HBM.*"', ("alertname", "!~", "GPU.*|HBM.*")),
        (' job != "a \\"b\\"" ', ("job", "!=", 'a "b"')),
        ('rack=~"r\\d+"', ("rack", "=~", "r\\d+")),  # unknown escapes stay for the regex
        ("host=", ("host", "=", "")),
    ],
)
def test_one_grammar_everywhere(text: str, triple: tuple[str, str, str]) -> None:
    kernel = parse_matcher(text)
    assert (kernel.label, kernel.op.value, kernel.value) == triple
    (in_selector,) = parse_selector(f"{TEMP}{{{text}}}").matchers
    assert in_selector == kernel
    stored = alert_matchers.parse_matcher(text)  # silences (CLI) and the alerts API
    assert (stored.name, stored.op, stored.value) == triple
    rule = InhibitRuleSettings(source_matchers=[text], target_matchers=[text])
    assert rule.source_matchers == [text]
    assert parse_matcher(str(kernel)) == kernel  # str() quotes so it reads back unchanged


def test_lists_and_quoting_round_trip() -> None:
    found = parse_matchers('host=n1, gpu=~"0|1",rack!~r[2-3],')
    assert [str(m) for m in found] == ['host="n1"', 'gpu=~"0|1"', 'rack!~"r[2-3]"']
    odd = 'a "quoted"\\ value\nwith\ttabs'
    assert parse_matcher(f"x={quote(odd)}").value == odd


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("host~n1", "bad matcher 'host~n1'"),
        ("host=n1 n2", "bad matcher"),
        ("host==n1", "bad matcher"),
        ("host=n1,gpu=0", "bad matcher"),  # one matcher where one is expected
        ("host=~(a)\\1", "invalid escape sequence"),  # backreference: RE2 refuses
        ("host=~(?=n)n1", "invalid perl operator"),  # lookahead
        ("host=~(", "missing )"),
        ("__name__=x", "invalid label name"),
    ],
)
def test_bad_matchers_are_one_line_errors(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_matcher(text)
    message = str(caught.value)
    assert reason in message and "\n" not in message
    with pytest.raises(ValueError):
        alert_matchers.parse_matcher(text)
    with pytest.raises(ValueError):
        InhibitRuleSettings(source_matchers=[text], target_matchers=["a=b"])


def test_regexes_run_on_re2_everywhere() -> None:
    (m,) = parse_selector(f'{TEMP}{{uuid=~"{HOSTILE}"}}').matchers
    assert type(m._regex).__module__.split(".")[0] == "re2"
    stored = alert_matchers.parse_matcher("alertname=~GPU.*")
    assert type(alert_matchers._compiled(stored)._regex).__module__.split(".")[0] == "re2"
    refused = "RE2 syntax: no backreferences or lookaround"
    with pytest.raises(InvalidQuery, match=refused):
        parse_selector(f'{TEMP}{{host=~"(n)\\\\1"}}')


@pytest.mark.timeout(120)
def test_the_hostile_regex_does_not_stall_over_a_large_label_set() -> None:
    selector = parse_selector(f'{TEMP}{{uuid=~"{HOSTILE}"}}')
    keys = [SeriesKey(TEMP, {**gpu("r0", f"n{i}", 0), "uuid": uuid(i)}) for i in range(20_000)]
    started = time.monotonic()
    assert not any(selector.matches(k) for k in keys)
    assert time.monotonic() - started < 5  # a stall detector, not a benchmark (RE2: ~50 ms)
    assert Selector(TEMP, selector.matchers).matches(SeriesKey(TEMP, {"uuid": "0123456789abcdefz"}))


@pytest.mark.timeout(120)
def test_the_api_answers_the_hostile_regex_and_unquoted_values(store: Store) -> None:
    now_ms = store.now_ms()
    store.write([Sample(SeriesKey(TEMP, {**gpu("r0", f"n{i}", 0), "uuid": uuid(i)}), now_ms, 1.0)
                 for i in range(300)])  # fmt: skip
    with TestClient(create_app(settings_for(store), store)) as client:
        started = time.monotonic()
        hostile = client.get("/api/v1/series", params={"match": f'{TEMP}{{uuid=~"{HOSTILE}"}}'})
        assert hostile.status_code == 200 and hostile.json()["items"] == []
        assert time.monotonic() - started < 5
        bare = client.get("/api/v1/query", params={"query": f"{TEMP}{{host=n7}}"})
        assert bare.status_code == 200, bare.text
        assert [s["labels"]["host"] for s in bare.json()["series"]] == ["n7"]
        back = client.get("/api/v1/series", params={"match": f'{TEMP}{{host=~"(n)\\\\1"}}'})
        assert back.status_code == 400 and "RE2" in back.json()["error"]["message"]
        alerts = client.get("/api/v1/alerts", params={"match": "rack=~(a)\\1"})
        assert alerts.status_code == 400 and "RE2" in alerts.json()["error"]["message"]
