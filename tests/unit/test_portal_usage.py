"""The usage API, its CSV and page show GPU-hours held, used and given back, per day and
per cohort: the portal's real routes, service and SQLite ledger (``test_portal_handlers``'s
portal), the reclaimer's figures written as it writes them."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from composespawner.domain.reclaim import GpuWatch
from composespawner.ledger.models import GpuGiveBackRow
from tests.unit.test_portal_handlers import Portal, hub_auth, portal, running

__all__ = ["hub_auth", "portal"]  # the fixtures, used by name

pytestmark = pytest.mark.timeout(30)


async def used_half_an_hour_and_gave_one_back_an_hour_ago(p: Portal) -> str:
    """student1's server on one T4 that the reclaimer saw work 30 minutes, and a second GPU
    it took from it an hour ago (the row as ``gave_back`` writes it, back-dated); the
    range that covers both (an hour ago may be yesterday)."""
    (gpu,) = await running(p, "student1")
    ledger = p.composer.ledger
    (machine,) = ledger.live_machines("student1")
    key = (machine.id, gpu)
    ledger.reclaims.save_watches({key: GpuWatch(since=0.0, last_at=0.0)}, {key: 1800.0})
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    with ledger.engine.begin() as connection:
        connection.execute(
            sa.insert(GpuGiveBackRow).values(
                machine_id=machine.id,
                user_name="student1",
                server_name="",
                cohort=None,
                block_id="other-t4",
                model="NVIDIA T4",
                action="detach",
                at=an_hour_ago,
                figures={"unheld_s": 700.0},
                actor="reclaimer",
            )
        )
    return f"since={an_hour_ago.date()}&until={datetime.now(UTC).date()}"


async def test_the_api_shows_used_and_given_back_per_day_and_cohort(portal: Portal) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})
    period = await used_half_an_hour_and_gave_one_back_an_hour_ago(portal)

    status, usage = await portal.json("GET", f"api/usage?{period}", user="admin")

    assert status == 200, usage
    assert usage["used_gpu_hours"] == 0.5
    assert usage["given_back_gpu_hours"] == pytest.approx(1.0, abs=0.01)
    assert usage["used_by_cohort"] == {"cs-101": 0.5}
    assert usage["given_back_by_cohort"]["cs-101"] == usage["given_back_gpu_hours"]
    assert usage["by_day"][-1]["used_gpu_hours"] == 0.5  # seen today
    given_back_days = sum(day["given_back_gpu_hours"] for day in usage["by_day"])
    assert given_back_days == pytest.approx(usage["given_back_gpu_hours"], abs=1e-3)
    held = sum(day["held_gpu_hours"] for day in usage["by_day"])
    assert held == pytest.approx(usage["gpu_hours"], abs=1e-3)
    assert usage["by_cohort"]["cs-101"] == usage["gpu_hours"]  # held: fields from before


async def test_the_csv_has_used_and_given_back_columns(portal: Portal) -> None:
    period = await used_half_an_hour_and_gave_one_back_an_hour_ago(portal)

    response = await portal.call("GET", f"api/usage?format=csv&{period}", user="admin")

    assert response.code == 200
    rows = list(csv.DictReader(io.StringIO(response.body.decode())))
    assert list(rows[0]) == [
        "day",
        "user",
        "model",
        "gpu_hours",
        "used_gpu_hours",
        "given_back_gpu_hours",
    ]
    today = datetime.now(UTC).date().isoformat()
    [mine] = [r for r in rows if r["day"] == today and r["user"] == "student1"]
    assert float(mine["used_gpu_hours"]) == 0.5
    given_back = sum(float(r["given_back_gpu_hours"]) for r in rows)
    assert given_back == pytest.approx(1.0, abs=0.01)


async def test_the_page_shows_the_three_figures_per_cohort_and_day(portal: Portal) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})
    period = await used_half_an_hour_and_gave_one_back_an_hour_ago(portal)

    response = await portal.call("GET", f"usage?{period}", user="admin")

    assert response.code == 200
    page = response.body.decode()
    assert 'id="usage-total-used"><strong>0.5</strong> used' in page
    assert 'id="usage-total-given-back"><strong>' in page
    today = datetime.now(UTC).date().isoformat()
    assert f"<tr><td>{today}</td><td>" in page  # the by-day table
    cohorts = page[page.index('id="usage-cohorts"') :]
    assert "<td>cs-101</td>" in cohorts[: cohorts.index("</table>")]
    assert "<td>0.5</td>" in cohorts[: cohorts.index("</table>")]


async def test_the_page_lists_the_servers_running_now(portal: Portal) -> None:
    await running(portal, "student1")
    (machine,) = portal.composer.ledger.live_machines("student1")

    response = await portal.call("GET", "usage", user="admin")

    page = response.body.decode()
    table = page[page.index('id="usage-running"') :]
    table = table[: table.index("</table>")]
    assert f"<td>student1</td><td>default</td><td>{machine.host_id}</td>" in table
    assert "<td>1 × NVIDIA T4</td>" in table
    assert "</time></td><td></td>" in table  # in no cohort
    assert table.count("<tr>") == 2  # the heading's and the one server's
