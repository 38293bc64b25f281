"""The simulator's message table against DMTF's published registries."""

from __future__ import annotations

import json

import pytest

from fabricsim.__main__ import bind_address
from fabricsim.errors import MESSAGES, REGISTRY_VERSIONS, error_body

from .harness import shared_dir


@pytest.mark.parametrize("key", sorted(MESSAGES))
def test_message_matches_its_registry(key: str) -> None:
    message = MESSAGES[key]
    version = REGISTRY_VERSIONS[message.registry]
    path = shared_dir() / "redfish" / "registries" / f"{message.registry}.{version}.json"
    published = json.loads(path.read_text())["Messages"][key]
    assert message.text == published["Message"]
    assert message.severity == published["MessageSeverity"]
    assert message.resolution == published["Resolution"]
    assert message.text.count("%") == published["NumberOfArgs"]


def test_error_body_shape() -> None:
    body = error_body("ResourceBlockInUse", ("r1-a100-1",))
    info = body["error"]["@Message.ExtendedInfo"][0]
    assert body["error"]["code"] == info["MessageId"] == "Composition.1.1.3.ResourceBlockInUse"
    assert info["Message"] == "Resource block 'r1-a100-1' cannot be part of any new compositions."
    assert info["MessageArgs"] == ["r1-a100-1"]


@pytest.mark.parametrize(
    ("ip", "port", "url", "expected"),
    [
        (None, None, None, ("127.0.0.1", 8010)),
        (None, None, "http://127.0.0.1:9123/services/fabric/", ("127.0.0.1", 9123)),
        (None, 8011, "http://10.0.0.5:9123/", ("127.0.0.1", 8011)),
        ("0.0.0.0", None, "http://10.0.0.5:9123/", ("0.0.0.0", 9123)),
        (None, None, "http://10.0.0.5:9123/", ("10.0.0.5", 9123)),
    ],
)
def test_bind_address(
    ip: str | None, port: int | None, url: str | None, expected: tuple[str, int]
) -> None:
    assert bind_address(ip, port, url) == expected
