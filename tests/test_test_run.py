"""The test run itself: what its processes inherit (tests/conftest.py)."""

from __future__ import annotations

import signal
import subprocess
import sys


def test_a_started_process_stops_on_sigint_even_if_the_run_was_started_ignoring_it() -> None:
    """Tests stop processes with SIGINT; a run started with ``&`` or nohup ignores it, which
    the processes it starts would inherit (and ignore each SIGINT until a timeout's kill)."""
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
    assert signal.getsignal(signal.SIGINT) != signal.SIG_IGN
