"""Authentication: Basic, sessions (login, use, logout), and the 401s."""

from __future__ import annotations

import base64

from .harness import PASSWORD, SYSTEMS, USERNAME, RedfishClient, StartSimulator

SESSIONS = "/redfish/v1/SessionService/Sessions"


def login(client: RedfishClient) -> tuple[str, str]:
    answer = client.post(SESSIONS, {"UserName": USERNAME, "Password": PASSWORD}, auth=False)
    assert answer.status == 201, answer.body
    assert answer.json["UserName"] == USERNAME
    return answer.headers["X-Auth-Token"], answer.headers["Location"]


def test_protected_resources_need_credentials(client: RedfishClient) -> None:
    answer = client.get(SYSTEMS, auth=False)
    assert answer.status == 401
    assert answer.message_ids == ["Base.1.22.1.NoValidSession"]
    bad = base64.b64encode(f"{USERNAME}:wrong".encode()).decode()
    assert client.get(SYSTEMS, auth=False, headers={"Authorization": f"Basic {bad}"}).status == 401
    assert client.get(SYSTEMS, auth=False, headers={"X-Auth-Token": "forged"}).status == 401
    assert client.get(SYSTEMS).status == 200


def test_session_login_use_and_logout(client: RedfishClient) -> None:
    token, location = login(client)
    assert location.startswith(f"{SESSIONS}/")
    with_token = {"X-Auth-Token": token}
    assert client.get(SYSTEMS, auth=False, headers=with_token).status == 200
    listed = client.get(SESSIONS, auth=False, headers=with_token).json["Members"]
    assert {"@odata.id": location} in listed
    assert client.get(location, auth=False, headers=with_token).json["UserName"] == USERNAME
    assert client.delete(location, auth=False, headers=with_token).status == 204
    answer = client.get(SYSTEMS, auth=False, headers=with_token)
    assert answer.status == 401
    assert client.delete(location).status == 404


def test_login_refusals(client: RedfishClient) -> None:
    wrong = client.post(SESSIONS, {"UserName": USERNAME, "Password": "nope"}, auth=False)
    assert wrong.status == 401
    assert wrong.message_ids == ["Base.1.22.1.AccessUnauthorized"]
    missing = client.post(SESSIONS, {"UserName": USERNAME}, auth=False)
    assert missing.status == 400
    assert missing.message_ids == ["Base.1.22.1.PropertyMissing"]
    typed = client.post(SESSIONS, {"UserName": USERNAME, "Password": 7}, auth=False)
    assert typed.message_ids == ["Base.1.22.1.PropertyValueTypeError"]


def test_credentials_come_from_the_command_line(start_simulator: StartSimulator) -> None:
    client = start_simulator("--username", "hub", "--password", "s3cret").client
    assert client.get(SYSTEMS).status == 401  # the default credentials no longer work
    answer = client.post(SESSIONS, {"UserName": "hub", "Password": "s3cret"}, auth=False)
    assert answer.status == 201
