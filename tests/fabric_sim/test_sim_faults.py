"""Each fault switch of ``/sim/faults``, seen from a client."""

from __future__ import annotations

import http.client
import time

import pytest

from .harness import SYSTEMS, RedfishClient, StartSimulator


def assert_dropped(client: RedfishClient, path: str = SYSTEMS) -> None:
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        client.get(path)


def wait_until_answering(client: RedfishClient, deadline_s: float) -> float:
    """Poll until a request is answered; seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        try:
            if client.get(SYSTEMS, timeout=1.0).status == 200:
                return time.monotonic() - start
        except (http.client.HTTPException, ConnectionError):
            time.sleep(0.05)  # polling a condition, bounded by the deadline
    raise AssertionError(f"no answer within {deadline_s}s")


def test_settings_round_trip_and_reset(client: RedfishClient) -> None:
    defaults = client.get("/sim/faults", auth=False).json
    assert defaults["error_rate"] == 0.0
    assert defaults["fail_after_attachments"] is None
    changed = client.faults(latency_s=0.01, stale_etags=True).json
    assert (changed["latency_s"], changed["stale_etags"]) == (0.01, True)
    assert changed["error_rate"] == 0.0  # a PUT replaces every setting
    assert client.delete("/sim/faults", auth=False).json == defaults


@pytest.mark.parametrize(
    "body",
    [
        {"error_rate": 1.5},
        {"latency_s": -1},
        {"drop_connections": "yes"},
        {"nonsense": 1},
        {"fail_after_attachments": 1.5},
        {"disabled_blocks": ["no-such-block"]},
        [],
    ],
)
def test_bad_settings_are_refused(client: RedfishClient, body: object) -> None:
    answer = client.put("/sim/faults", body, auth=False)
    assert answer.status == 400
    assert "error" in answer.json


def test_latency_is_added_to_every_request(client: RedfishClient) -> None:
    client.faults(latency_s=0.3)
    start = time.monotonic()
    assert client.get("/redfish/v1/", auth=False).status == 200
    assert time.monotonic() - start >= 0.3


def test_error_rate_fails_that_share_of_writes(client: RedfishClient) -> None:
    client.faults(error_rate=1.0)
    answer = client.attach("host-01", "r1-a100-1")
    assert (answer.status, answer.message_ids) == (
        503,
        ["Base.1.22.1.ServiceTemporarilyUnavailable"],
    )
    assert answer.headers["Retry-After"] == "1"
    assert client.get(SYSTEMS).status == 200  # reads are not affected
    assert client.sim_state()["hosts"]["host-01"]["attached"] == []


def test_error_rate_is_repeatable_with_a_seed(client: RedfishClient) -> None:
    def outcomes() -> list[int]:
        client.faults(error_rate=0.5, seed=42)
        return [client.detach("host-01", "r1-a100-1").status for _ in range(12)]

    first = outcomes()
    assert set(first) == {204, 503}
    assert outcomes() == first


def test_fail_after_attachments(client: RedfishClient) -> None:
    client.faults(fail_after_attachments=1)
    assert client.attach("host-01", "r1-a100-1").status == 204
    answer = client.attach("host-01", "r1-a100-2")
    assert (answer.status, answer.message_ids) == (500, ["Base.1.22.1.InternalError"])
    assert client.attach("host-01", "r1-a100-3").status == 500
    assert client.detach("host-01", "r1-a100-1").status == 204  # detaching still works
    assert client.sim_state()["hosts"]["host-01"]["attached"] == []


def test_drop_connections(client: RedfishClient) -> None:
    client.faults(drop_connections=True)
    assert_dropped(client)
    assert_dropped(client, "/redfish/v1/")
    assert client.get("/sim/state", auth=False).status == 200  # the switch stays reachable
    client.delete("/sim/faults", auth=False)
    assert client.get(SYSTEMS).status == 200


def test_unreachable_for_a_while(client: RedfishClient) -> None:
    client.faults(unreachable_for_s=0.6)
    assert_dropped(client)
    took = wait_until_answering(client, deadline_s=10.0)
    assert took > 0.2


def test_stale_etags(client: RedfishClient) -> None:
    system = client.get(f"{SYSTEMS}/host-01")
    block_etag = client.get("/redfish/v1/CompositionService/ResourceBlocks/r1-a100-1").headers[
        "ETag"
    ]
    client.faults(stale_etags=True)
    tag = {"Oem": {"ComposeSpawner": {"Hub": "h", "Machine": "m", "Owner": "o"}}}
    patch = client.patch(f"{SYSTEMS}/host-01", tag, headers={"If-Match": system.headers["ETag"]})
    assert (patch.status, patch.message_ids) == (412, ["Base.1.22.1.PreconditionFailed"])
    assert client.patch(f"{SYSTEMS}/host-01", tag).status == 428  # still required
    assert client.attach("host-01", "r1-a100-1", ResourceBlockETag=block_etag).status == 412
    assert client.attach("host-01", "r1-a100-1").status == 204  # no ETag given, no check


def test_disabled_blocks_are_listed_in_the_state(client: RedfishClient) -> None:
    client.faults(disabled_blocks=["r2-t4-1", "host-06-block"])
    assert client.sim_state()["disabled_blocks"] == ["host-06-block", "r2-t4-1"]
    assert client.get(f"{SYSTEMS}/host-06").json["Status"]["State"] == "Disabled"


def test_reset_state_detaches_everything(client: RedfishClient) -> None:
    assert client.attach("host-01", "r1-a100-1").status == 204
    client.patch(
        f"{SYSTEMS}/host-01",
        {"Oem": {"ComposeSpawner": {"Hub": "h", "Machine": "m", "Owner": "o"}}},
        headers={"If-Match": "*"},
    )
    assert client.delete("/sim/state", auth=False).status == 204
    assert client.sim_state()["hosts"]["host-01"] == {"attached": [], "tag": None}


def test_sim_endpoints_exist_only_with_the_faults_api(start_simulator: StartSimulator) -> None:
    client = start_simulator().client
    assert client.get("/sim/faults", auth=False).status == 404
    assert client.put("/sim/faults", {"drop_connections": True}, auth=False).status == 404
    assert client.get(SYSTEMS).status == 200
