"""Protocol details DMTF's Redfish Protocol Validator checks, each on its own.

One test per rule the simulator once broke: an unsupported OData-Version,
logging in through ``Sessions/Members``, the ``Link: rel=describedby`` header,
a PATCH whose body is not typed JSON, weak ETags in If-Match, and
If-None-Match on reads.
"""

from __future__ import annotations

import pytest

from .harness import PASSWORD, SYSTEMS, USERNAME, RedfishClient

SESSIONS = "/redfish/v1/SessionService/Sessions"
HOST = f"{SYSTEMS}/host-02"
TAG = {"Oem": {"ComposeSpawner": {"Hub": "hub", "Machine": "m-1", "Owner": "ann/"}}}


def test_an_unsupported_odata_version_is_a_412(client: RedfishClient) -> None:
    assert client.get("/redfish/v1/", headers={"OData-Version": "4.0"}).status == 200
    refused = client.get("/redfish/v1/", headers={"OData-Version": "4.1"})
    assert refused.status == 412
    assert refused.message_ids == ["Base.1.22.1.HeaderInvalid"]
    assert "OData-Version: 4.1" in refused.json["error"]["message"]


def test_post_to_the_sessions_members_logs_in(client: RedfishClient) -> None:
    credentials = {"UserName": USERNAME, "Password": PASSWORD}
    answer = client.post(f"{SESSIONS}/Members", credentials, auth=False)
    assert answer.status == 201, answer.body
    token, location = answer.headers["X-Auth-Token"], answer.headers["Location"]
    assert location.startswith(f"{SESSIONS}/")
    assert client.get(SYSTEMS, auth=False, headers={"X-Auth-Token": token}).status == 200
    wrong = client.post(f"{SESSIONS}/Members", {**credentials, "Password": "no"}, auth=False)
    assert wrong.status == 401


@pytest.mark.parametrize(
    ("path", "schema"),
    [
        ("/redfish/v1/", "ServiceRoot.v1_20_0.json"),
        (SYSTEMS, "ComputerSystemCollection.json"),
        (HOST, "ComputerSystem.v1_27_0.json"),
    ],
)
def test_reads_say_which_schema_describes_them(
    client: RedfishClient, path: str, schema: str
) -> None:
    for method in ("GET", "HEAD"):
        answer = client.request(method, path)
        assert answer.status == 200
        link = f"<http://redfish.dmtf.org/schemas/v1/{schema}>; rel=describedby"
        assert answer.headers["Link"] == link
    assert client.get(path).json["@odata.type"].startswith(f"#{schema.removesuffix('.json')}.")


def test_a_patch_not_typed_json_is_a_415(client: RedfishClient) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        headers = {"Content-Type": content_type, "If-Match": "*"}
        refused = client.patch(HOST, TAG, headers=headers)
        assert refused.status == 415, content_type
        assert refused.message_ids == ["Base.1.22.1.HeaderInvalid"]
    assert client.get(HOST).json["Oem"] == {}  # nothing was written
    typed = {"Content-Type": "application/json; charset=utf-8", "If-Match": "*"}
    assert client.patch(HOST, TAG, headers=typed).status == 200


def test_a_weak_etag_never_satisfies_if_match(client: RedfishClient) -> None:
    etag = client.get(HOST).headers["ETag"]
    assert not etag.startswith("W/")
    refused = client.patch(HOST, TAG, headers={"If-Match": f"W/{etag}"})
    assert refused.status == 412
    assert client.get(HOST).json["Oem"] == {}
    assert client.patch(HOST, TAG, headers={"If-Match": etag}).status == 200


def test_if_none_match_with_the_current_etag_is_a_304(client: RedfishClient) -> None:
    etag = client.get(HOST).headers["ETag"]
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        answer = client.get(HOST, headers={"If-None-Match": header})
        assert (answer.status, answer.body, answer.headers["ETag"]) == (304, b"", etag), header
    assert client.get(HOST, headers={"If-None-Match": '"other"'}).status == 200
    assert client.patch(HOST, TAG, headers={"If-Match": etag}).status == 200
    changed = client.get(HOST, headers={"If-None-Match": etag})  # the write changed the ETag
    assert changed.status == 200
    assert changed.json["Oem"] != {}
