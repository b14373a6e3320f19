"""`hbmwatch silence`, `hbmwatch incidents` and `hbmwatch rules` from a shell."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hbmwatch.alerts.runner import Alerting
from hbmwatch.settings import AlertSettings, StoreSettings
from hbmwatch.store.store import open_store
from hbmwatch.taxonomy import FindingKind
from tests.test_alerting import stated
from tests.test_alerts_engine import gpu
from tests.test_service import HBMWATCH, clean_env


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HBMWATCH, *args], cwd=tmp_path, env=clean_env(), text=True,
                          capture_output=True, timeout=60)  # fmt: skip


def test_silence_add_list_expire_and_incidents(tmp_path: Path) -> None:
    assert run(tmp_path, "migrate").returncode == 0
    bad = run(tmp_path, "silence", "add", "host~n1")
    assert bad.returncode == 2 and "bad matcher 'host~n1'" in bad.stderr
    refused = run(tmp_path, "silence", "add", "host=~(n)\\1")  # a backreference: not RE2
    assert refused.returncode == 2 and "RE2" in refused.stderr and "Traceback" not in refused.stderr
    added = run(tmp_path, "silence", "add", "host=n1", 'rack=~"r[0-3]"', "--for", "30m",
                "--by", "alice", "--comment", "swap")  # fmt: skip
    assert added.returncode == 0, added.stderr
    silence_id = added.stdout.strip()
    listed = run(tmp_path, "silence", "list")
    assert silence_id in listed.stdout and 'rack=~"r[0-3]"' in listed.stdout

    store = open_store(StoreSettings(url=f"sqlite:///{tmp_path / 'hbmwatch.db'}"))
    try:  # a running service would apply the silence on its next cycle: so does this one
        alerting = Alerting(store, AlertSettings())
        alerting.start()

        class Now:
            def __call__(self) -> float:
                return store.now_ms() / 1000

        f = stated(Now(), FindingKind.THROTTLE, gpu("r0", "n1", 0))  # type: ignore[arg-type]
        alerting.process([f])
        assert store.alerts.alerts()[0].silenced_by == (silence_id,)
    finally:
        store.close()

    shown = json.loads(run(tmp_path, "incidents", "--json").stdout)
    assert len(shown) == 1 and shown[0]["state"] == "open" and shown[0]["alerts"] == 1
    assert run(tmp_path, "silence", "expire", silence_id).returncode == 0
    assert silence_id not in run(tmp_path, "silence", "list").stdout
    assert silence_id in run(tmp_path, "silence", "list", "--all").stdout
    assert run(tmp_path, "silence", "expire", "nope").returncode == 1


def test_rules_writes_the_rules_and_their_tests(tmp_path: Path) -> None:
    done = run(tmp_path, "rules", "--out", str(tmp_path / "rules"))
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (tmp_path / "rules").iterdir()} == {
        "hbmwatch-rules.yml", "hbmwatch-rules.test.yml"}  # fmt: skip
