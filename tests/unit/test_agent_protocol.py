"""The hub-agent wire protocol: what the agent refuses, and what goes round intact."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from composespawner.domain.activity import GpuActivity, Holder
from composespawner.launchers.agent_protocol import (
    MAX_REQUEST_BYTES,
    Done,
    Exited,
    Failed,
    ListNotebooks,
    PollNotebook,
    Progress,
    ReadActivity,
    Refused,
    RefusedReply,
    StackSource,
    StartNotebook,
    StopNotebook,
    WatchExits,
    activity_fields,
    encode_request,
    parse_activity,
    parse_reply,
    parse_request,
    reply,
)

pytestmark = pytest.mark.timeout(30)

LOCK = "jupyterlab==4.2.5 \\\n    --hash=sha256:00\n"
START = StartNotebook(
    user="student1",
    server="",
    machine="0123456789abcdef0123456789abcdef",
    gpus=("GPU-1b2f4c3e-55aa-4bb0-8c1d-2e3f4a5b6c7d",),
    cores=4,
    memory_gib=32,
    env=(("JUPYTERHUB_API_TOKEN", "secret"), ("JUPYTERHUB_SERVICE_URL", "http://h:1/user/a/")),
    args=("--debug",),
    stack=StackSource(
        id="pytorch",
        label="PyTorch 2.13",
        lock_sha256=hashlib.sha256(LOCK.encode()).hexdigest(),
        lock=LOCK,
        common=(("repro.py", "print('hi')\n"),),
    ),
    manifest={"user": "student1"},
)


def start_body(**changes: Any) -> bytes:
    body = json.loads(encode_request(START))
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "request_",
    [START, StopNotebook("m1"), PollNotebook("m1"), WatchExits(), ListNotebooks(), ReadActivity()],
    ids=["start", "stop", "poll", "watch", "list", "activity"],
)
def test_every_request_goes_round_intact(request_: Any) -> None:
    assert parse_request(encode_request(request_)) == request_


def test_a_whole_host_start_has_no_share() -> None:
    whole = StartNotebook(
        user="a", server="x", machine="m", gpus=("0", "1"), cores=None, memory_gib=None
    )
    assert parse_request(encode_request(whole)) == whole


def test_a_share_goes_round_and_a_whole_gpu_says_nothing_of_shares() -> None:
    quarter = replace(START, gpu_share=4)
    assert json.loads(encode_request(quarter))["gpu_share"] == 4
    assert parse_request(encode_request(quarter)) == quarter
    # A hub before shares sends none: whole GPUs; and sends none to an agent before them.
    assert "gpu_share" not in json.loads(encode_request(START))
    assert parse_request(encode_request(START)) == replace(START, gpu_share=1)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"user": "../etc"}, "cannot be an account's name"),
        ({"user": "a;id"}, "cannot be an account's name"),
        ({"user": "$(reboot)"}, "cannot be an account's name"),
        ({"user": "Alice"}, "cannot be an account's name"),
        ({"user": "1000"}, "cannot be an account's name"),
        ({"user": "a" * 33}, "cannot be an account's name"),
        ({"user": ["root"]}, "cannot be an account's name"),
        ({"server": "../x"}, "server"),
        ({"machine": "m/../../x"}, "machine"),
        ({"gpus": ["GPU-1;rm -rf /"]}, "a GPU"),
        ({"gpus": ["0", "0"]}, "names a GPU twice"),
        ({"gpus": ["00"]}, "'00' is not allowed"),
        ({"gpus": ["GPU-aaaa0000", "GPU-AAAA0000"]}, "names a GPU twice"),
        ({"gpus": "0"}, "gpus is a list"),
        ({"cores": 0}, "cores"),
        ({"cores": -4}, "cores"),
        ({"cores": 10**9}, "cores"),
        ({"cores": 4.5}, "cores"),
        ({"cores": "4"}, "cores"),
        ({"cores": True}, "cores"),
        ({"memory_gib": None}, "both given"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "not the hub's to set"),
        ({"env": {"LD_LIBRARY_PATH": "/tmp"}}, "not the hub's to set"),
        ({"env": {"PATH": "/tmp"}}, "not the hub's to set"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}, "not the hub's to set"),
        ({"env": {"A B": "x"}}, "not a variable's name"),
        ({"env": {"X": 1}}, "without NUL"),
        ({"env": {"X": "a\0b"}}, "without NUL"),
        ({"args": ["/bin/sh"]}, "is not an option"),
        ({"args": ["-c"]}, "is not an option"),
        ({"home": "/root"}, "does not know: home"),
        ({"command": ["id"]}, "does not know: command"),
        ({"gpu_share": 0}, "gpu_share"),
        ({"gpu_share": 65}, "gpu_share"),
        ({"gpu_share": 0.25}, "gpu_share"),
        ({"gpu_share": "4"}, "gpu_share"),
        ({"gpu_share": True}, "gpu_share"),
        ({"gpu_share": None}, "gpu_share"),
        ({"gpu_share": 4, "gpus": []}, "a share of exactly one GPU, not 0"),
        ({"gpu_share": 4, "gpus": ["0", "1"]}, "a share of exactly one GPU, not 2"),
        ({"v": 2}, "protocol version"),
        ({"op": "exec"}, "unknown op"),
    ],
)
def test_a_start_the_agent_must_not_do_is_refused_with_the_reason(
    changes: dict[str, Any], said: str
) -> None:
    with pytest.raises(Refused) as refused:
        parse_request(start_body(**changes))
    assert said in str(refused.value)


def test_a_stack_whose_lock_does_not_match_its_hash_is_refused() -> None:
    body = json.loads(encode_request(START))
    body["stack"]["lock"] += "evil==1.0\n"
    with pytest.raises(Refused, match="does not hash"):
        parse_request(json.dumps(body).encode())


@pytest.mark.parametrize("name", ["../repro.py", "a/b.py", ".bashrc", ""])
def test_common_files_are_plain_names(name: str) -> None:
    body = json.loads(encode_request(START))
    body["stack"]["common"] = {name: "x"}
    with pytest.raises(Refused, match="plain file names"):
        parse_request(json.dumps(body).encode())


@pytest.mark.parametrize(
    "data", [b"", b"[]", b"not json", b'{"v": 1}', b'{"v":1,"op":"poll"}', b"\xff"]
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(Refused):
        parse_request(data)


def test_a_request_too_big_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(Refused, match="bytes, more than"):
        parse_request(b" " * (MAX_REQUEST_BYTES + 1))


def test_the_hub_cannot_encode_what_the_agent_would_refuse() -> None:
    bad = StartNotebook(user="root;id", server="", machine="m", gpus=(), cores=1, memory_gib=1)
    with pytest.raises(Refused):
        encode_request(bad)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (reply(progress="building", percent=40), Progress("building", 40)),
        (reply(ok=True, ip="127.0.1.3", port=4000), Done({"ip": "127.0.1.3", "port": 4000})),
        (reply(ok=False, refused="no"), RefusedReply("no")),
        (reply(ok=False, error="broke"), Failed("broke")),
        (reply(exited="m1", status=None), Exited("m1", None)),
        (reply(exited="m1", status=137), Exited("m1", 137)),
    ],
)
def test_replies_read_back(line: bytes, expected: object) -> None:
    assert parse_reply(line) == expected


@pytest.mark.parametrize(
    "line",
    [b"", b"[1]", b'{"ok": "yes"}', b'{"ok": false}', b'{"progress": "x", "percent": 900}'],
)
def test_a_reply_that_is_not_the_agents_is_an_error(line: bytes) -> None:
    with pytest.raises(ValueError, match="not"):
        parse_reply(line)


# -- an activity's answer ----------------------------------------------------------

UUID = "1b2f4c3e-55aa-4bb0-8c1d-2e3f4a5b6c7d"
GPUS = [
    GpuActivity(UUID, 0.0, 2000.0, 2, (Holder(41, "4f0c3a52-1d2e"), Holder(77, None))),
    GpuActivity("9" + UUID[1:], 87.5, 9000.0, None, None),  # holders not named
]


def test_an_activity_goes_round_intact_through_a_reply_line() -> None:
    line = reply(ok=True, **activity_fields(GPUS))
    done = parse_reply(line)
    assert isinstance(done, Done)
    assert parse_activity(done.fields) == {gpu.uuid: gpu for gpu in GPUS}


def test_an_activity_names_gpus_as_nvml_gives_them() -> None:
    gpu = {"uuid": f"GPU-{UUID.upper()}", "utilization": 3, "memory_used_mib": 1}
    (read,) = parse_activity({"gpus": [gpu | {"processes": 0, "holders": []}]}).values()
    assert read == GpuActivity(UUID, 3.0, 1.0, 0, ())


def test_a_kernel_id_the_hub_would_refuse_leaves_that_gpus_holders_unknown() -> None:
    # Any user may start a process naming a "connection file" (kernel-<é>.json): its GPU's
    # holders go unnamed, and the rest of the host's reading stays good.
    odd = GpuActivity(UUID, 0.0, 900.0, 2, (Holder(41, "é"), Holder(42, "k" * 129)))
    fields = activity_fields([odd, GPUS[1]])
    read = parse_activity(json.loads(json.dumps(fields)))
    assert read == {UUID: replace(odd, holders=None), GPUS[1].uuid: GPUS[1]}


def gpu(**changes: Any) -> dict[str, Any]:
    body = activity_fields(GPUS[:1])["gpus"][0]
    body.update(changes)
    return {"gpus": [body]}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "gpus is not a list"),
        ({"gpus": {"a": 1}}, "gpus is not a list"),
        ({"gpus": [gpu()["gpus"][0]] * 65}, "at most 64"),
        ({"gpus": ["GPU-1"]}, "a GPU is not an object"),
        ({"gpus": [gpu()["gpus"][0]] * 2}, "listed twice"),
        (gpu(uuid="../etc"), "uuid"),
        (gpu(uuid=None), "uuid"),
        (gpu(utilization=101), "utilization"),
        (gpu(utilization=-1), "utilization"),
        (gpu(utilization=float("nan")), "utilization"),
        (gpu(utilization=True), "utilization"),
        (gpu(utilization="5"), "utilization"),
        (gpu(memory_used_mib=1e12), "memory_used_mib"),
        (gpu(memory_used_mib=None), "memory_used_mib"),
        (gpu(processes=-1), "processes"),
        (gpu(processes=False), "processes"),
        (gpu(holders="kernel"), "holders is a list"),
        (gpu(holders=[[41]]), "not a \\[pid, kernel\\] pair"),
        (gpu(holders=[{"pid": 41}]), "not a \\[pid, kernel\\] pair"),
        (gpu(holders=[[0, None]]), "pid"),
        (gpu(holders=[["41", None]]), "pid"),
        (gpu(holders=[[41, "../../api/users"]]), "kernel"),
        (gpu(holders=[[41, ""]]), "kernel"),
        (gpu(holders=[[41, None], [41, "k"]]), "twice"),
        (gpu(holders=[[41, "k"], [41, "k"]]), "twice"),
        (gpu(processes=1), "2 holders of 1 processes"),
        (gpu(processes=None), "2 holders of None processes"),
    ],
)
def test_an_activity_that_is_not_the_agents_is_an_error(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_activity(fields)


def test_a_request_nested_past_the_parser_is_refused() -> None:
    with pytest.raises(Refused, match="nests deeper"):
        parse_request(b"[" * 100_000)
