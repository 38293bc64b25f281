"""The reclaimer's pass: a real SQLite ledger, the real composer on the strict in-process
fabric, scripted GPU activity and a strict fake of the servers' kernels API.

Time is the ``now`` each sweep is given: a pass every 30 s, as the service would make
them, under a policy of minutes (the demo's).
"""

from __future__ import annotations

import logging
import pwd
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from composespawner.activity.agent import AgentActivity
from composespawner.commands import hubconfig
from composespawner.commands.reclaim import ReclaimerApp
from composespawner.domain.activity import ActivityReading, GpuActivity
from composespawner.domain.reclaim import GpuWatch, ReclaimPolicy, cohort_policy
from composespawner.domain.request import MachineRequest
from composespawner.ledger import GiveBack, Ledger, Machine
from composespawner.services.composer import Composer
from composespawner.services.kernels import KernelsUnavailable, NotebookKernels, server_prefix
from composespawner.services.reclaimer import (
    Action,
    Key,
    Reclaimer,
    active_seconds,
    gpus_by_host,
    judge,
)
from harness.tls import make_tls_files
from tests.support.activity_fakes import (
    TOKEN,
    FakeKernels,
    FakeKernelsServer,
    ScriptedActivity,
    busy,
    idle,
)
from tests.support.composers import demo_composer
from tests.support.faulty import Faults, FaultyFabric

pytestmark = pytest.mark.timeout(60)

POLICY = ReclaimPolicy(detach_after=120, warn_after=300, reclaim_after=600, max_gap=60)
EVERY = 30.0  # seconds between passes
ONE_T4 = MachineRequest(gpu_model="t4", gpu_count=1, network="shared", scratch_gb=0)


@dataclass
class Scene:
    """One running server with one GPU, and what the reclaimer works with."""

    composer: Composer
    source: ScriptedActivity
    kernels: FakeKernels
    reclaimer: Reclaimer
    machine: Machine
    block: str
    uuid: str

    @property
    def host(self) -> str:
        return self.machine.host_id or ""

    def fabric(self) -> FaultyFabric:
        assert isinstance(self.composer.fabric, FaultyFabric)
        return self.composer.fabric

    def attached(self) -> bool:
        return self.block in self.fabric().state.attached(self.host)

    def held(self) -> bool:
        return self.composer.ledger.holders().get(self.block) == self.machine.id

    def givebacks(self) -> list[GiveBack]:
        now = datetime.now().astimezone()
        return self.composer.ledger.reclaims.givebacks(now - timedelta(days=1), now + timedelta(1))

    async def sweeps(self, start: float, end: float) -> dict[float, list[Action]]:
        return await sweeps(self.reclaimer, start, end)


async def sweeps(reclaimer: Reclaimer, start: float, end: float) -> dict[float, list[Action]]:
    """A pass every EVERY seconds from ``start`` to ``end`` included: what each did."""
    done: dict[float, list[Action]] = {}
    at = start
    while at <= end:
        done[at] = await reclaimer.sweep(at)
        at += EVERY
    return done


async def running_on(
    composer: Composer, user: str = "u", server: str = "", request: MachineRequest = ONE_T4
) -> Machine:
    """``user``'s server running on a machine composed for ``request``."""
    composed = await composer.compose(
        user=user,
        groups=frozenset(),
        server=server,
        request=request,
        progress=lambda message: None,
        then=("launching", "starting notebook"),
    )
    await composer.record(composed.machine_id, "running", "notebook up")
    return await composer.running_machine(user, server)


@pytest.fixture
async def kernels_server() -> AsyncIterator[FakeKernelsServer]:
    server = FakeKernelsServer(FakeKernels())
    server.start()
    yield server
    await server.stop()


@pytest.fixture
async def scene(tmp_path: Path, kernels_server: FakeKernelsServer) -> AsyncIterator[Scene]:
    composer = demo_composer(tmp_path)
    client = NotebookKernels(kernels_server.url, TOKEN, timeout=5.0)
    try:
        machine = await running_on(composer)
        inventory = await composer.pool.known_inventory()
        [block] = [b for b in machine.block_ids if (d := inventory.device(b)) and d.kind == "gpu"]
        device = inventory.device(block)
        assert device is not None
        assert device.uuid
        source = ScriptedActivity()
        reclaimer = Reclaimer(composer, source, site_policy=POLICY, kernels=client)
        yield Scene(
            composer, source, kernels_server.fake, reclaimer, machine, block, device.uuid.lower()
        )
    finally:
        await client.close()
        await composer.close()


def _kinds(done: dict[float, list[Action]]) -> dict[float, list[tuple[str, str]]]:
    """The passes that did anything: the actions' kinds and outcomes."""
    return {at: [(a.kind, a.outcome) for a in actions] for at, actions in done.items() if actions}


# -- the pass, end to end ---------------------------------------------------------------


async def test_a_gpu_nothing_holds_is_detached_after_detach_after_and_recorded(
    scene: Scene,
) -> None:
    scene.source.set(scene.host, idle(scene.uuid))

    done = await scene.sweeps(0, 120)

    assert _kinds(done) == {120: [("detach", "done")]}
    assert not scene.attached()
    assert not scene.held()
    [record] = scene.givebacks()
    assert (record.machine_id, record.block_id, record.action) == (
        scene.machine.id,
        scene.block,
        "detach",
    )
    assert record.figures["unheld_s"] == 120
    assert scene.composer.ledger.reclaims.watches() == {}
    assert scene.kernels.requests == []  # a GPU nothing holds needs no kernel shut down


async def test_a_busy_gpu_is_never_touched(scene: Scene) -> None:
    scene.source.set(scene.host, busy(scene.uuid))

    done = await scene.sweeps(0, 1800)

    assert _kinds(done) == {}
    assert scene.attached()
    assert scene.held()
    watch = scene.composer.ledger.reclaims.watches()[(scene.machine.id, scene.block)]
    assert (watch.since, watch.last_work_at) == (0, 1800)


async def test_an_unreadable_host_is_unknown_never_idle_and_its_outage_logged_once(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    scene.source.fail(scene.host)

    with caplog.at_level(logging.INFO):
        done = await scene.sweeps(0, 1800)
        scene.source.set(scene.host, idle(scene.uuid))
        again = await scene.sweeps(1830, 1830)

    assert _kinds(done) == {}
    assert _kinds(again) == {}
    assert scene.attached()
    assert scene.held()
    assert scene.source.reads[scene.host] == 62
    outage = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(outage) == 1
    assert outage[0].levelno == logging.WARNING
    assert [r.getMessage() for r in caplog.records if "readable again" in r.getMessage()] == [
        f"{scene.host} readable again"
    ]
    watch = scene.composer.ledger.reclaims.watches()[(scene.machine.id, scene.block)]
    assert watch.since == 1830  # the run starts at the first reading seen


async def test_a_fabric_never_read_leaves_every_gpu_alone_and_is_logged_once(
    scene: Scene, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A reclaimer started while the fabric is down: no inventory read yet, so no UUIDs.
    down = FaultyFabric(scene.fabric().state, Faults(unreachable=True))
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    composer = Composer(ledger=ledger, fabric=down, catalog=scene.composer.catalog, hub_id="h")
    scene.source.set(scene.host, idle(scene.uuid))
    reclaimer = Reclaimer(composer, scene.source, site_policy=POLICY)
    try:
        with caplog.at_level(logging.INFO):
            passes = [await reclaimer.sweep(at) for at in range(0, 300, 30)]
            down.faults.heal()
            healed = await reclaimer.sweep(300)
    finally:
        await composer.close()

    assert passes == [[]] * 10
    assert healed == []  # the first readable pass only starts the run
    assert scene.source.reads[scene.host] == 1
    said = [r.getMessage() for r in caplog.records if "fabric" in r.getMessage().lower()]
    assert len([m for m in said if "unreadable" in m]) == 1
    assert "The fabric readable again" in said
    assert scene.attached()


async def test_a_gpu_the_source_does_not_list_is_unknown(scene: Scene) -> None:
    scene.source.set(scene.host)  # the exporter answers, without this GPU

    done = await scene.sweeps(0, 1800)

    assert _kinds(done) == {}
    assert scene.attached()
    assert scene.held()


async def test_an_idle_held_gpu_is_warned_then_reclaimed_only_after_the_wait(
    scene: Scene,
) -> None:
    scene.kernels.run("u", "", "k1", "k2")
    scene.source.set(scene.host, idle(scene.uuid, held=True))

    done = await scene.sweeps(0, 570)

    assert _kinds(done) == {300: [("warn", "done")]}
    watch = scene.composer.ledger.reclaims.watches()[(scene.machine.id, scene.block)]
    assert watch.warned_at == 300
    assert scene.kernels.requests == []
    assert scene.attached()

    [reclaim] = (await scene.sweeps(600, 600))[600]

    assert (reclaim.kind, reclaim.outcome) == ("reclaim", "done")
    assert "2 kernel(s)" in reclaim.detail
    assert sorted(scene.kernels.deletes()) == ["/user/u/api/kernels/k1", "/user/u/api/kernels/k2"]
    assert scene.kernels.kernel_ids("u", "") == []
    assert not scene.attached()
    assert not scene.held()
    [record] = scene.givebacks()
    assert record.action == "reclaim"
    assert record.figures["warned_at"] == 300


async def test_a_keep_holds_off_the_detach(scene: Scene) -> None:
    scene.source.set(scene.host, idle(scene.uuid))
    await scene.sweeps(0, 90)
    scene.composer.ledger.reclaims.keep("u", "", scene.block, POLICY, 100.0)

    done = await scene.sweeps(120, 600)

    assert _kinds(done) == {}
    assert scene.attached()
    assert scene.held()


async def test_a_keep_pressed_while_the_pass_decided_wins_over_its_detach(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene.source.set(scene.host, idle(scene.uuid))
    await scene.sweeps(0, 90)
    reclaims = scene.composer.ledger.reclaims
    save = reclaims.save_watches

    def saved_then_kept(changes: Mapping[Key, GpuWatch], active: Mapping[Key, float]) -> None:
        save(changes, active)
        reclaims.keep("u", "", scene.block, POLICY, 119.0)  # the user, a moment later

    monkeypatch.setattr(reclaims, "save_watches", saved_then_kept)
    [skipped] = (await scene.sweeps(120, 120))[120]

    assert (skipped.kind, skipped.outcome, skipped.detail) == (
        "detach",
        "skipped",
        "its user pressed Keep",
    )
    assert scene.attached()
    assert scene.held()


class _Restarting(ScriptedActivity):
    """A source during whose read the server is stopped and started again."""

    restart: Callable[[], Awaitable[None]] | None = None

    async def read(self, host_id: str) -> ActivityReading:
        if self.restart is not None:
            restart, self.restart = self.restart, None
            await restart()
        return await super().read(host_id)


async def test_a_server_started_again_during_the_pass_keeps_its_new_gpu(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _Restarting()
    scene.reclaimer.source = source
    source.set(scene.host, idle(scene.uuid))
    await scene.sweeps(0, 90)
    # The pass read the watches before the restart (the ledger forgets an ended machine's).
    before = scene.composer.ledger.reclaims.watches()
    monkeypatch.setattr(scene.composer.ledger.reclaims, "watches", lambda: before)
    started: list[Machine] = []

    async def restart() -> None:
        await scene.composer.release(scene.machine.id, reason="stopped")
        started.append(await running_on(scene.composer))

    source.restart = restart
    [skipped] = (await scene.sweeps(120, 120))[120]

    [again] = started
    assert (skipped.kind, skipped.outcome) == ("detach", "skipped")
    assert "moved on" in skipped.detail
    assert set(again.block_ids) <= set(scene.composer.ledger.holders())
    assert scene.givebacks() == []


async def test_a_failing_shrink_records_nothing_and_the_next_pass_tries_again(
    scene: Scene,
) -> None:
    scene.source.set(scene.host, idle(scene.uuid))
    await scene.sweeps(0, 90)
    scene.fabric().faults.unreachable = True

    [failed] = (await scene.sweeps(120, 120))[120]

    assert (failed.kind, failed.outcome) == ("detach", "failed")
    assert scene.held()
    assert scene.givebacks() == []
    assert (scene.machine.id, scene.block) in scene.composer.ledger.reclaims.watches()

    scene.fabric().faults.heal()
    [done] = (await scene.sweeps(150, 150))[150]

    assert (done.kind, done.outcome) == ("detach", "done")
    assert not scene.attached()
    assert not scene.held()
    assert [r.action for r in scene.givebacks()] == ["detach"]


async def test_kernels_that_cannot_be_shut_down_leave_the_gpu_attached(scene: Scene) -> None:
    scene.kernels.run("u", "", "k1")
    scene.kernels.answer_all = 503
    scene.source.set(scene.host, idle(scene.uuid, held=True))

    done = await scene.sweeps(0, 600)

    assert _kinds(done) == {300: [("warn", "done")], 600: [("reclaim", "failed")]}
    assert scene.attached()
    assert scene.held()
    assert scene.givebacks() == []


async def test_a_stopped_servers_gpu_is_no_longer_watched(scene: Scene) -> None:
    scene.source.set(scene.host, idle(scene.uuid))
    await scene.sweeps(0, 90)
    await scene.composer.release(scene.machine.id, reason="stopped")

    done = await scene.sweeps(120, 240)

    assert _kinds(done) == {}  # no running machine holds a GPU: nothing is read
    assert scene.givebacks() == []


# -- deciding, pure ---------------------------------------------------------------------


def _machine(**fields: object) -> Machine:
    now = datetime(2026, 11, 27)
    values: dict[str, object] = {
        "id": "m1",
        "user_name": "u",
        "server_name": "",
        "state": "running",
        "host_id": "host-01",
        "zone": "z",
        "request": {},
        "failure": None,
        "created_at": now,
        "updated_at": now,
        "ended_at": None,
        "block_ids": ("gpu-a", "gpu-b", "nic-1"),
    }
    return Machine(**{**values, **fields})  # type: ignore[arg-type]


async def test_only_whole_gpus_of_running_machines_are_watched(scene: Scene) -> None:
    inventory = await scene.composer.pool.known_inventory()
    gpus = sorted(d.block_id for d in inventory.devices if d.kind == "gpu")[:2]
    nics = [d.block_id for d in inventory.devices if d.kind == "nic"][:1]
    running = _machine(block_ids=(*gpus, *nics))
    sharing = _machine(id="m2", block_ids=(gpus[0],), shared=(gpus[0],), gpu_share=4)
    launching = _machine(id="m3", state="launching")

    by_host = gpus_by_host([running, sharing, launching], inventory)

    assert [(g.machine.id, g.block_id) for g in by_host["host-01"]] == [("m1", b) for b in gpus]
    assert all(g.uuid and g.uuid == g.uuid.lower() for g in by_host["host-01"])


def test_active_seconds_count_only_intervals_seen_at_both_ends_that_did_work() -> None:
    first = judge(None, busy("a"), 0.0, POLICY)
    worked = judge(first.watch, busy("a"), 30.0, POLICY)
    rested = judge(worked.watch, idle("a", held=True), 60.0, POLICY)
    after_gap = judge(rested.watch, busy("a"), 200.0, POLICY)  # past max_gap: unseen
    after_unknown = judge(
        judge(after_gap.watch, None, 230.0, POLICY).watch, busy("a"), 260.0, POLICY
    )

    assert [first.active_s, worked.active_s, rested.active_s] == [0.0, 30.0, 0.0]
    assert (after_gap.active_s, after_unknown.active_s) == (0.0, 0.0)
    nonsense = GpuActivity("a", float("nan"), 1.0, None)
    assert judge(worked.watch, nonsense, 60.0, POLICY).active_s == 0.0
    assert active_seconds(None, worked.watch, 30.0) == 0.0


def test_a_warning_is_recorded_in_the_watch_it_is_decided_in() -> None:
    watch = GpuWatch(since=0.0, last_at=270.0, last_held_at=270.0, idle_from=0.0)

    judged = judge(watch, idle("a", held=True), 300.0, POLICY)

    assert judged.decision.action == "warn"
    assert judged.watch.warned_at == 300.0


def test_a_cohort_policy_that_no_longer_fits_falls_back_to_the_sites() -> None:
    assert cohort_policy(POLICY, None) == (POLICY, None)
    shorter, problem = cohort_policy(POLICY, {"detach_after": 90})
    assert (shorter.detach_after, problem) == (90, None)
    site, problem = cohort_policy(POLICY, {"warn_after": 900})  # past the site's reclaim_after
    assert site == POLICY
    assert problem
    assert "warn_after" in problem
    # Readings further apart than max_gap never fill a window: the site's, said why.
    site, problem = cohort_policy(POLICY, {"max_gap": 10}, interval=15)
    assert site == POLICY
    assert problem
    assert "max_gap (10 s) must be more than the reclaimer's interval (15 s)" in problem


# -- the kernels client -----------------------------------------------------------------


async def test_the_kernels_client_lists_and_shuts_down_kernels_of_named_servers(
    kernels_server: FakeKernelsServer,
) -> None:
    kernels_server.fake.run("ann@lab", "thesis run", "k1")
    client = NotebookKernels(kernels_server.url, TOKEN, timeout=5.0)
    try:
        [kernel] = await client.kernels("ann@lab", "thesis run")
        await client.shut_down("ann@lab", "thesis run", "k1")
        await client.shut_down("ann@lab", "thesis run", "k1")  # already gone: done

        assert (kernel.id, kernel.execution_state) == ("k1", "idle")
        assert kernels_server.fake.kernel_ids("ann@lab", "thesis run") == []
        assert kernels_server.fake.deletes()[0] == "/user/ann@lab/thesis%20run/api/kernels/k1"
        with pytest.raises(KernelsUnavailable, match="424"):
            await client.kernels("ann@lab", "other")
    finally:
        await client.close()


async def test_the_kernels_client_takes_no_refusal_for_an_answer(
    kernels_server: FakeKernelsServer,
) -> None:
    kernels_server.fake.run("u", "", "k1")
    wrong = NotebookKernels(kernels_server.url, "not-the-token", timeout=5.0)
    try:
        with pytest.raises(KernelsUnavailable, match="403"):
            await wrong.kernels("u", "")
    finally:
        await wrong.close()
    assert server_prefix("a/b", "") == "/user/a%2Fb/"


async def test_the_kernels_client_checks_the_hubs_certificate_with_its_ca_bundle(
    tmp_path: Path,
) -> None:
    files = make_tls_files(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(files.cert, files.key)
    server = FakeKernelsServer(FakeKernels(), tls)
    server.start()
    server.fake.run("u", "", "k1")
    trusting = NotebookKernels(server.url, TOKEN, 5.0, ca_bundle=str(files.ca_bundle))
    system = NotebookKernels(server.url, TOKEN, 5.0)  # the system's CAs: not this one
    try:
        assert [k.id for k in await trusting.kernels("u", "")] == ["k1"]
        with pytest.raises(KernelsUnavailable, match="certificate verify failed"):
            await system.kernels("u", "")
    finally:
        await trusting.close()
        await system.close()
        await server.stop()


# -- the service's configuration ---------------------------------------------------------


def _app(tmp_path: Path, config: str) -> ReclaimerApp:
    config_file = tmp_path / "jupyterhub_config.py"
    config_file.write_text("c = get_config()\n" + config)
    app = ReclaimerApp()
    app.initialize(["-f", str(config_file)])
    return app


@pytest.fixture(autouse=True)
def _no_app_left() -> object:
    yield
    ReclaimerApp.clear_instance()


def test_the_service_reads_its_policy_and_source_from_the_hubs_config(tmp_path: Path) -> None:
    app = _app(
        tmp_path,
        "c.ComposeSettings.reclaim_policy = {'detach_after': 120, 'max_gap': 60}\n"
        "c.ReclaimerApp.interval = 15\n"
        "c.ReclaimerApp.dcgm_url_template = 'http://fabric/dcgm/{host_id}/metrics'\n",
    )

    policy = app.site_policy()

    assert (policy.detach_after, policy.max_gap, policy.warn_after) == (120, 60, 1800.0)
    assert app.source().url("host-01") == "http://fabric/dcgm/host-01/metrics"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (
            "c.ComposeSettings.reclaim_policy = {'detach_after': -1}\n",
            "detach_after must be a number",
        ),
        (
            "c.ComposeSettings.reclaim_policy = {'max_gap': 60}\nc.ReclaimerApp.interval = 60\n",
            "max_gap",
        ),
        ("c.ReclaimerApp.dcgm_url_template = 'http://one/metrics'\n", "has no {host_id}"),
        ("c.ReclaimerApp.activity_source = 'agent'\n", "set c.SSHLauncher.hosts"),
        (
            "c.ReclaimerApp.activity_source = 'agent'\n"
            "c.SSHLauncher.hosts = {'host-01': '10.0.0.1'}\nc.SSHLauncher.ssh_key = '/k'\n",
            "set c.SSHLauncher.known_hosts",
        ),
    ],
)
def test_a_policy_or_source_that_cannot_work_stops_the_service_at_start(
    tmp_path: Path, config: str, said: str
) -> None:
    app = _app(tmp_path, config)

    with pytest.raises(SystemExit, match=re.escape(said)):
        app.check()


def test_the_agent_source_reaches_the_hosts_as_the_ssh_launcher_does(tmp_path: Path) -> None:
    app = _app(
        tmp_path,
        "c.ReclaimerApp.activity_source = 'agent'\n"
        "c.ReclaimerApp.activity_timeout = 4\n"
        "c.SSHLauncher.hosts = {'host-01': '10.0.0.1', 'host-02': '10.0.0.2:2222'}\n"
        "c.SSHLauncher.ssh_key = '/etc/composespawner/hub_key'\n"
        "c.ComposeSSHSpawner.known_hosts = '/etc/composespawner/known_hosts'\n",
    )

    source = app.source()

    assert isinstance(source, AgentActivity)
    assert source.timeout == 4
    settings = source.settings.link_settings(source.hosts["host-02"])
    assert (settings.address, settings.port, settings.key, settings.known_hosts) == (
        "10.0.0.2",
        2222,
        "/etc/composespawner/hub_key",
        "/etc/composespawner/known_hosts",
    )


def test_a_hub_ca_bundle_that_cannot_be_read_stops_the_service_at_start(tmp_path: Path) -> None:
    app = _app(
        tmp_path,
        "c.ReclaimerApp.hub_url = 'https://gpu-hub.example.edu'\n"
        f"c.ReclaimerApp.hub_ca_bundle = '{tmp_path}/missing.pem'\n",
    )

    with pytest.raises(SystemExit, match=r"hub_ca_bundle .*missing\.pem.* cannot be used"):
        app.check()


def test_the_reclaimers_role_may_reach_servers_and_nothing_more(tmp_path: Path) -> None:
    services = hubconfig.Services(config_file=tmp_path / "c.py", portal_port=1)

    without = {r["name"] for r in hubconfig.roles()}
    [role] = [r for r in hubconfig.roles(reclaimer=True) if r["name"] == "compose-reclaimer"]

    assert "compose-reclaimer" not in without
    assert role == {
        "name": "compose-reclaimer",
        "scopes": ["access:servers"],
        "services": ["compose-reclaimer"],
    }
    service = services.reclaimer()
    assert service["name"] == "compose-reclaimer"
    assert service["command"][-2:] == ["reclaimer", f"--config={(tmp_path / 'c.py').resolve()}"]


def test_nvml_holders_are_believed_for_the_account_the_notebooks_run_as(tmp_path: Path) -> None:
    # The demo's: every notebook as the shared account (the hub is root here).
    shared = _app(tmp_path, "c.ComposeSpawner.shared_account = True\n")
    assert shared.notebook_account == "composespawner-nb"
    uid = pwd.getpwnam("composespawner-nb").pw_uid
    assert shared._notebook_uids(_machine(user_name="student1")) == {uid}
    ReclaimerApp.clear_instance()
    # Production's: each user's own account, named as they are; one not here is unknown.
    own = _app(tmp_path, "c.ReclaimerApp.activity_source = 'nvml'\n")
    assert own.notebook_account == ""
    assert own._notebook_uids(_machine(user_name="root")) == {0}
    assert own._notebook_uids(_machine(user_name="no-such-account-here")) is None
