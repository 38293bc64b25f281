"""How fast the GPU portal answers at a university's scale, on SQLite and on PostgreSQL.

The data: 10,000 hub users in 500 cohorts (hub groups of 20, each with weekly
sessions, a reservation and a quota rule), 500 user quota overrides, 2,000
devices of which 500 running machines hold a quarter, and 1,000,000 usage
records (GPU periods of ended machines of 1, 2, 4 or 8 GPUs of one model, by
random users on random days) over 120 days with the daily sums the ledger
keeps of them (what the usage page reads). The
portal runs as the demo runs it, under the real hub and proxy, with the real
HubOAuth token check on every request.

Timed: each page and its API call, ``REQUESTS`` times after a warm-up, as an
admin (inventory, quotas, usage) and as a user in a cohort (my machine), while
a server stops (and starts again) every 2 s, as on a busy hub: what each stop
ends lands in the usage tables, so no page reads a ledger at rest. Side
by side in the same run, under the same hub and proxy: JupyterHub's own home
page and REST user model, the floor any page of a hub pays. The goal is every
page at most 100 ms p95. Writes ``benchmarks/results/portal_latency.json``
(``p95_ms`` per page and back-end, and the ratio to the hub's own page).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as day_time
from pathlib import Path
from typing import Any, cast

import requests
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from benchmarks.hubload import RESULTS, percentile
from benchmarks.interrupt import interrupt_on_sigterm
from composespawner.domain.cohorts import Cohort, Session
from composespawner.domain.quotas import QuotaRule
from composespawner.ledger import Actor, DeviceRecord, Ledger
from composespawner.ledger.models import (
    MachineRow,
    UsageDayRow,
    UsageModelDayRow,
    UsageRecordRow,
)
from composespawner.services.settings import upgrade_ledger
from harness.hub import PORTAL, Hub, running_hub, wait_for_portal

USAGE_DAYS = 120
GPU_MIX = (1, 2, 4, 8)  # GPUs of an ended machine, as often as the weights say
GPU_MIX_WEIGHTS = (50, 25, 15, 10)
REQUESTS = 100
WARM_UP = 5
GOAL_MS = 100.0
CHURN_EVERY = 2.0  # seconds between server stops while timing: 1,800 an hour
SEED = 2026
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PG_DATABASE = "composespawner_portal_bench"
MODELS = ("NVIDIA T4", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA H100 PCIe")
CATALOG_IDS = {"NVIDIA T4": "t4", "NVIDIA A100 80GB PCIe": "a100", "NVIDIA L40S": "l40s"}
ADMIN = Actor("admin", "127.0.0.1")
BENCH_TOKEN = "portal-latency-bench-token-0123456789abcdef"
# A service that makes the hub's users and groups, and tokens for them.
BENCH_CONFIG = f"""
c.JupyterHub.services.append({{"name": "portal-bench", "api_token": "{BENCH_TOKEN}"}})
c.JupyterHub.load_roles.append(
    {{"name": "portal-bench", "services": ["portal-bench"],
      "scopes": ["admin:users", "admin:groups", "tokens"]}}
)
"""
PAGES = {  # name → (path under the portal, who asks)
    "inventory": ("inventory", "admin"),
    "inventory_api": ("api/inventory", "admin"),
    "quotas": ("quotas", "admin"),
    "quotas_api": ("api/quotas", "admin"),
    "usage": ("usage", "admin"),
    "usage_api": ("api/usage", "admin"),
    "my_machine": ("", "user"),
    "my_machine_api": ("api/me", "user"),
}


@dataclass(frozen=True)
class Scale:
    users: int = 10_000
    cohorts: int = 500
    devices: int = 2_000
    running: int = 500  # running machines, one GPU each: a quarter of the devices held
    usage_records: int = 1_000_000
    user_rules: int = 500

    def members(self, cohort: int) -> list[str]:
        per = self.users // self.cohorts
        return [user_name(n) for n in range(cohort * per, (cohort + 1) * per)]


FULL = Scale()


def user_name(n: int) -> str:
    return f"u{n:05d}"


def cohort_name(n: int) -> str:
    return f"course-{n:03d}"


# -- the ledger's data ---------------------------------------------------------------


def fill_ledger(url: str, today: date, scale: Scale = FULL) -> dict[str, int]:
    """The ledger at ``url``, upgraded and filled; counts of what it holds."""
    upgrade_ledger(url)
    rng = random.Random(SEED)
    ledger = Ledger(url)
    try:
        devices = [
            DeviceRecord(
                f"rack-{n // 200:02d}-gpu-{n % 200:03d}",
                "gpu",
                MODELS[n % len(MODELS)],
                frozenset({f"rack-{n // 200:02d}"}),
                f"rack-{n // 200:02d}-drawer-{n % 200 // 20}",
            )
            for n in range(scale.devices)
        ]
        ledger.sync_devices(devices)
        for n in range(scale.running):  # each of the first users runs a server holding one GPU
            machine = ledger.request_machine(user_name(n), "", {"gpu_model": "t4", "gpu_count": 1})
            gpu = devices[n]
            zone = next(iter(gpu.zones))
            ledger.claim(machine, host_id=f"host-{n}", zone=zone, block_ids=[gpu.block_id])
            ledger.advance(machine, ("composed", ""), ("launching", ""), ("running", ""))
        for n in range(scale.cohorts):
            name = cohort_name(n)
            day = n % 5
            cohort = Cohort(
                name,
                title=f"Course {n}",
                starts_on=today - timedelta(days=30),
                ends_on=today + timedelta(days=90),
                sessions=(
                    Session.parse(f"{('Mon', 'Tue', 'Wed', 'Thu', 'Fri')[day]} 09:00-11:00"),
                ),
                reserved_model="t4" if n % 10 == 0 else None,
                reserved_gpus=2 if n % 10 == 0 else 0,
            )
            ledger.policy.set_cohort(cohort, ADMIN)
            ledger.policy.set_quota_rule(QuotaRule("cohort", name, gpus_held=2, servers=2), ADMIN)
        for n in range(0, scale.users, scale.users // scale.user_rules):
            rule = QuotaRule("user", user_name(n), gpus_held=rng.choice((1, 4, 8)))
            ledger.policy.set_quota_rule(rule, ADMIN)
        ledger.policy.set_quota_rule(QuotaRule("site", "", gpus_held=4), ADMIN)
        _fill_usage(ledger.engine, rng, today, scale)
    finally:
        ledger.close()
    _analyze(url)
    return asdict(scale)


def _fill_usage(engine: sa.Engine, rng: random.Random, today: date, scale: Scale) -> None:
    """Ended machines of 1 to 8 GPUs of one model until ``usage_records`` GPU periods,
    and the daily sums the ledger keeps of them (as machines end, it adds to both)."""
    machines = cast(sa.Table, MachineRow.__table__)
    usage = cast(sa.Table, UsageRecordRow.__table__)
    sums: dict[tuple[date, str, str], float] = defaultdict(float)
    made = m = 0
    while made < scale.usage_records:
        machine_rows, usage_rows = [], []
        while made < scale.usage_records and len(usage_rows) < 50_000:
            user = user_name(rng.randrange(scale.users))
            day = today - timedelta(days=rng.randrange(USAGE_DAYS))
            start = datetime.combine(day, day_time(8), UTC) + timedelta(minutes=rng.randrange(600))
            end = start + timedelta(minutes=rng.randrange(10, 240))
            machine_id = f"ended-{m:08d}"
            m += 1
            machine_rows.append(
                {
                    "id": machine_id,
                    "user_name": user,
                    "server_name": "",
                    "state": "released",
                    "host_id": "host-0",
                    "zone": "rack-00",
                    "request": {},
                    "failure": None,
                    "created_at": start,
                    "updated_at": end,
                    "ended_at": end,
                    "cohort": None,
                }
            )
            model = rng.choice(MODELS)  # a machine's GPUs are of one model
            gpus = min(rng.choices(GPU_MIX, GPU_MIX_WEIGHTS)[0], scale.usage_records - made)
            for g in range(gpus):
                usage_rows.append(
                    {
                        "machine_id": machine_id,
                        "user_name": user,
                        "server_name": "",
                        "block_id": f"rack-00-gpu-{g:03d}",
                        "kind": "gpu",
                        "model": model,
                        "started_at": start,
                        "ended_at": end,
                    }
                )
                sums[day, user, model] += (end - start).total_seconds()
            made += gpus
        with engine.begin() as connection:
            connection.execute(machines.insert(), machine_rows)
            connection.execute(usage.insert(), usage_rows)
    by_model: dict[tuple[date, str], float] = defaultdict(float)
    for (day, _, model), seconds in sums.items():
        by_model[day, model] += seconds
    user_days = [
        {"day": day, "user_name": user, "model": model, "gpu_seconds": seconds}
        for (day, user, model), seconds in sums.items()
    ]
    model_days = [
        {"day": day, "model": model, "gpu_seconds": seconds}
        for (day, model), seconds in by_model.items()
    ]
    with engine.begin() as connection:
        for first in range(0, len(user_days), 50_000):
            connection.execute(
                cast(sa.Table, UsageDayRow.__table__).insert(), user_days[first : first + 50_000]
            )
        connection.execute(cast(sa.Table, UsageModelDayRow.__table__).insert(), model_days)


def _analyze(url: str) -> None:
    """Planner statistics for what was bulk-loaded, as autovacuum keeps them on a live
    PostgreSQL (without them it sorts a period's rows on disk to group them)."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("VACUUM ANALYZE" if "postgresql" in url else "ANALYZE"))
    finally:
        engine.dispose()


@contextmanager
def postgres_database() -> Iterator[str | None]:
    """A fresh database on the local PostgreSQL, dropped after; None if there is none."""
    admin = sa.create_engine(
        PG_ADMIN,
        isolation_level="AUTOCOMMIT",
        poolclass=NullPool,
        connect_args={"connect_timeout": 5},
    )
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)"))
            connection.execute(sa.text(f"CREATE DATABASE {PG_DATABASE}"))
    except sa.exc.OperationalError as e:
        print(f"PostgreSQL not reachable ({str(e).splitlines()[0]}): SQLite only")
        admin.dispose()
        yield None
        return
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{PG_DATABASE}"
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)"))
        admin.dispose()


# -- the hub's users and groups --------------------------------------------------------


def bench_session() -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"token {BENCH_TOKEN}"
    return session


def fill_hub(hub: Hub, scale: Scale = FULL) -> None:
    session = bench_session()
    names = [user_name(n) for n in range(scale.users)]
    for first in range(0, scale.users, 2_000):
        response = session.post(
            f"{hub.url}/hub/api/users",
            json={"usernames": names[first : first + 2_000]},
            timeout=300,
        )
        assert response.status_code == 201, response.text
    for n in range(scale.cohorts):
        group = cohort_name(n)
        response = session.post(f"{hub.url}/hub/api/groups/{group}", json={}, timeout=60)
        assert response.status_code == 201, response.text
        response = session.post(
            f"{hub.url}/hub/api/groups/{group}/users", json={"users": scale.members(n)}, timeout=60
        )
        assert response.status_code == 200, response.text


def token_of(hub: Hub, user: str) -> str:
    response = bench_session().post(
        f"{hub.url}/hub/api/users/{user}/tokens", json={"note": "portal_latency"}, timeout=60
    )
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


# -- timing ----------------------------------------------------------------------------


def timed(get: Callable[[], requests.Response]) -> dict[str, float]:
    for _ in range(WARM_UP):
        get().raise_for_status()
    times = []
    for _ in range(REQUESTS):
        began = time.perf_counter()
        response = get()
        times.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, response.text[:500]
    return {"p50_ms": round(percentile(times, 50), 2), "p95_ms": round(percentile(times, 95), 2)}


def churn(url: str, running: int, every: float, stop: Any, ended: Any) -> None:
    """A busy hub while the pages are timed, in a process of its own (not in the timing
    client's): every ``every`` seconds one running server stops (its use lands in the
    usage tables) and its user starts it again; ``ended`` counts them."""
    ledger = Ledger(url)
    try:
        while not stop.wait(every):
            user = user_name(ended.value % running)
            machine = ledger.live_machine(user, "")
            assert machine is not None, user
            assert machine.state == "running", machine
            ledger.transition(machine.id, "stopping", "churn")
            ledger.release(machine.id)
            again = ledger.request_machine(user, "", machine.request)
            ledger.claim(
                again, host_id=machine.host_id, zone=machine.zone or "", block_ids=machine.block_ids
            )
            ledger.advance(again, ("composed", ""), ("launching", ""), ("running", ""))
            ended.value += 1
    finally:
        ledger.close()


@contextmanager
def churning(url: str, running: int, every: float = CHURN_EVERY) -> Iterator[Callable[[], int]]:
    """``churn`` running beside the block; yields how many servers it has ended so far,
    and fails the block if it stopped before being told to."""
    context = multiprocessing.get_context("spawn")
    stop, ended = context.Event(), context.Value("i", 0)
    process = context.Process(target=churn, args=(url, running, every, stop, ended))
    process.start()
    try:
        yield lambda: int(ended.value)
        if not process.is_alive():
            raise RuntimeError(f"the churn process died (exit status {process.exitcode})")
    finally:
        stop.set()
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()


def measure(hub: Hub) -> dict[str, Any]:
    tokens = {"admin": token_of(hub, "admin"), "user": token_of(hub, user_name(1))}
    sessions = {}
    for who, token in tokens.items():
        sessions[who] = requests.Session()
        sessions[who].headers["Authorization"] = f"token {token}"
    pages = {}
    for name, (path, who) in PAGES.items():
        url = f"{hub.url}{PORTAL}{path}"
        pages[name] = timed(lambda url=url, s=sessions[who]: s.get(url, timeout=60))
        print(
            f"  {name:16} p50 {pages[name]['p50_ms']:7.1f} ms   p95 {pages[name]['p95_ms']:7.1f} ms"
        )
    user = sessions["user"]
    baseline = {
        "hub_home": timed(lambda: user.get(f"{hub.url}/hub/home", timeout=60)),
        "hub_api_user": timed(lambda: user.get(f"{hub.url}/hub/api/user", timeout=60)),
    }
    floor = baseline["hub_home"]["p95_ms"]
    for figures in pages.values():
        figures["vs_hub_home"] = round(figures["p95_ms"] / floor, 2)
    print(
        f"  {'hub home page':16} p50 {baseline['hub_home']['p50_ms']:7.1f} ms   p95 {floor:7.1f} ms"
    )
    return {"pages": pages, "baseline": baseline}


def run_backend(name: str, url: str, today: date) -> dict[str, Any]:
    began = time.monotonic()
    counts = fill_ledger(url, today)
    print(f"{name}: ledger filled in {time.monotonic() - began:.0f} s")
    with tempfile.TemporaryDirectory(prefix="portal-bench-") as tmp:
        extra = f'{BENCH_CONFIG}\nc.ComposeSpawner.ledger_url = "{url}"\n'
        # The reconciler would end the ledger's made-up machines (no hub server runs them).
        with running_hub(Path(tmp), extra, COMPOSE_RECONCILE_GRACE=str(24 * 3600)) as hub:
            wait_for_portal(hub)
            fill_hub(hub)
            began = time.monotonic()
            with churning(url, FULL.running) as ended:
                figures = measure(hub)
                per_hour = ended() * 3600 / (time.monotonic() - began)
    print(f"  while {per_hour:.0f} servers an hour stopped and started again")
    return {**figures, "data": counts, "servers_ended_per_hour": round(per_hour)}


def main() -> None:
    today = datetime.now(UTC).date()
    results: dict[str, Any] = {
        "goal_p95_ms": GOAL_MS,
        "requests_per_page": REQUESTS,
        "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="portal-ledger-") as tmp:
        results["backends"]["sqlite"] = run_backend(
            "sqlite", f"sqlite:///{Path(tmp) / 'ledger.sqlite'}", today
        )
    with postgres_database() as url:
        if url is not None:
            results["backends"]["postgresql"] = run_backend("postgresql", url, today)
    worst = max(
        page["p95_ms"]
        for backend in results["backends"].values()
        for page in backend["pages"].values()
    )
    results["worst_p95_ms"] = worst
    results["meets_goal"] = worst <= GOAL_MS
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "portal_latency.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"worst page p95 {worst:.1f} ms (goal {GOAL_MS:.0f} ms)")


if __name__ == "__main__":
    interrupt_on_sigterm()
    sys.exit(main())
