"""``hbmwatch eval --random N --seed S``: draw, run, score at the incident level, bin.

The runs go through ``evaluation.run.evaluate`` and ``incident_report.score_incidents``
exactly as the bundled scenarios do; ``evaluation.limits`` adds the detection-limit
tables.  The per-scenario rows of the usual tables (one per draw) stay in the JSON.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from hbmwatch.cli.common import console


def run_random(count: int, seed: int, *, jobs: int, duration: float | None,
               json_out: Path | None, save_dir: Path | None,
               done: Callable[[Any], None], **options: Any) -> bool:  # fmt: skip
    """Draw ``count`` scenarios from ``seed``, run and score them; whether the limits held."""
    from hbmwatch.evaluation import incident_report, limits, scoring
    from hbmwatch.evaluation import run as evaluation
    from hbmwatch.simulator.random_scenarios import draw_scenarios, scenario_toml

    drawn = draw_scenarios(count, seed)
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        for d in drawn:
            (save_dir / f"{d.scenario.name}.toml").write_text(scenario_toml(d.scenario))
        console.print(f"{len(drawn)} scenario file(s) written to {save_dir}")
    gpu_h = sum(d.scenario.gpus * min(d.scenario.duration, duration or 1e12) for d in drawn)
    console.print(f"drew {count} scenario(s) from seed {seed}: {gpu_h / 3600:,.0f} GPU-h")
    results = evaluation.evaluate([d.scenario for d in drawn], [None], jobs=jobs,
                                  duration_s=duration, done=done, **options)  # fmt: skip
    report = scoring.score(results)
    paged = incident_report.score_incidents(results)
    limit = limits.limits_report(
        [f for d in drawn for f in d.faults],
        paged.faults,
        unexplained_rate=paged.unexplained_pages_per_1000_gpu_h,
        healthy_gpu_hours=paged.healthy_gpu_hours,
        redraws=sum(d.redraws for d in drawn),
    )
    wide = Console(width=200)
    wide.print(dataclasses.replace(paged, by_scenario=[]).table())
    for table in (limit.overall, *limit.by_kind.values()):
        wide.print(limits.limit_rich_table(table))
    for line in limits.summary_lines(limit):
        console.print(line)
    if json_out is not None:
        data = report.to_json() | {
            "random": {"count": count, "seed": seed, "draws": [d.to_json() for d in drawn]},
            "limits": limit.to_json(),
            "incidents": paged.to_json(),
            "runs": [evaluation.run_summary(r) for r in results],
        }
        json_out.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"report written to {json_out}")
    return limit.passed
