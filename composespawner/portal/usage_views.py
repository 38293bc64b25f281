"""The usage report as the portal shows it (the page, ``GET api/usage``) and exports it
(its CSV): plain data, no I/O. The three figures, held, used and given back, are defined
in :mod:`composespawner.domain.usage`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from composespawner.domain.usage import FIGURES, DayUse, UsageReport

# The first four are the CSV's columns from before used and given back: clients that read
# them by position keep working.
USAGE_COLUMNS = ("day", "user", "model", "gpu_hours", "used_gpu_hours", "given_back_gpu_hours")
_COLUMN = {"held": "gpu_hours", "used": "used_gpu_hours", "given_back": "given_back_gpu_hours"}


def usage_json(report: UsageReport, running: list[dict[str, Any]]) -> dict[str, Any]:
    """A usage report as the page and the API show it: the fields from before used and
    given back (``gpu_hours`` is held) unchanged, those two added beside them."""
    return {
        "since": report.period.first.isoformat(),
        "until": report.period.last.isoformat(),
        "gpu_hours": _hours(report.total),
        "used_gpu_hours": _hours(report.used_total),
        "given_back_gpu_hours": _hours(report.given_back_total),
        "models": report.models(),
        "by_day": [
            {
                "day": day.isoformat(),
                "gpu_hours": {m: _hours(h) for m, h in sorted(models.items())},
                "held_gpu_hours": _hours(report.held_on(day)),
                "used_gpu_hours": _hours(report.used_by_day.get(day, 0.0)),
                "given_back_gpu_hours": _hours(report.given_back_by_day.get(day, 0.0)),
            }
            for day, models in sorted(report.by_day.items())
        ],
        "by_model": {m: _hours(h) for m, h in sorted(report.by_model.items())},
        "by_cohort": {c: _hours(h) for c, h in sorted(report.by_cohort.items())},
        "used_by_cohort": {c: _hours(h) for c, h in sorted(report.used_by_cohort.items())},
        "given_back_by_cohort": {
            c: _hours(h) for c, h in sorted(report.given_back_by_cohort.items())
        },
        "top_users": [{"user": u, "gpu_hours": _hours(h)} for u, h in report.top_users()],
        "running": running,
    }


def cohort_rows(usage: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """The page's cohorts table from ``usage_json``'s dict: (cohort, held, used, given back)
    rows. A row a tuple, not three look-ups in the template: 500 cohorts' rows were a third
    of the page's rendering."""
    used, given_back = usage["used_by_cohort"], usage["given_back_by_cohort"]
    return [
        (cohort, held, used.get(cohort, 0.0), given_back.get(cohort, 0.0))
        for cohort, held in usage["by_cohort"].items()
    ]


def running_rows(running: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The page's running-now table from ``usage_json``'s ``running``: (user, server, host,
    GPUs, since, cohort) rows, each cell as shown. Its 500 rows, each cell a look-up and a
    filter in the template, were most of the page's rendering."""
    return [
        (
            m["user"],
            m["server"] or "default",
            m["host"] or "",
            ", ".join(m["shares"]) if m["shares"] else f"{m['gpus']} × {', '.join(m['models'])}",
            m["since"],
            m["cohort"] or "",
        )
        for m in running
    ]


def usage_rows(uses: Iterable[DayUse]) -> list[dict[str, Any]]:
    """One CSV row per day, user and model, each figure in its column (running machines'
    share added in to held; 0 where a figure has none)."""
    seconds: dict[tuple[str, str, str], dict[str, float]] = {}
    for use in uses:
        key = (use.day.isoformat(), use.user, use.model)
        figures = seconds.setdefault(key, dict.fromkeys(FIGURES, 0.0))
        figures[use.figure] += use.seconds
    return [
        {
            "day": day,
            "user": user,
            "model": model,
            **{_COLUMN[figure]: _hours(value / 3600) for figure, value in figures.items()},
        }
        for (day, user, model), figures in sorted(seconds.items())
    ]


def _hours(value: float) -> float:
    return round(value, 4)  # about a second: a short test run still shows
