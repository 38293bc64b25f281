"""CampusAuthenticator's own checks: the discovery document, the ID token, allowed domains.

The provider's answers are the only double here: its JWKS comes from a strict
stand-in for ``httpfetch`` that serves one URL and fails on any other. The whole
login runs against a real provider in tests/browser/test_production_login.py.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from oauthenticator.generic import GenericOAuthenticator
from tornado import web

from composespawner.auth.oidc import (
    CampusAuthenticator,
    DiscoveryFailed,
    ProviderEndpoints,
    email_domain,
)

ISSUER = "https://login.example.edu/realms/campus"
JWKS = f"{ISSUER}/protocol/openid-connect/certs"
DOCUMENT = {
    "issuer": ISSUER,
    "authorization_endpoint": f"{ISSUER}/auth",
    "token_endpoint": f"{ISSUER}/token",
    "userinfo_endpoint": f"{ISSUER}/userinfo",
    "jwks_uri": JWKS,
    "id_token_signing_alg_values_supported": ["RS256", "none"],
}


def test_discovery_document_gives_the_endpoints_and_never_none() -> None:
    endpoints = ProviderEndpoints.from_document(ISSUER, DOCUMENT)
    assert endpoints.token_url == f"{ISSUER}/token"
    assert endpoints.jwks_uri == JWKS
    assert endpoints.signing_algorithms == ("RS256",)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"issuer": ISSUER + "/"}, "calls itself"),
        ({"token_endpoint": "http://login.example.edu/token"}, "no https token_endpoint"),
        ({"jwks_uri": None}, "no https jwks_uri"),
        ({"id_token_signing_alg_values_supported": ["none"]}, "with nothing this hub checks"),
    ],
)
def test_a_discovery_document_that_does_not_fit_is_refused(
    change: dict[str, Any], says: str
) -> None:
    with pytest.raises(DiscoveryFailed, match=says):
        ProviderEndpoints.from_document(ISSUER, {**DOCUMENT, **change})


@pytest.mark.parametrize(
    ("user_info", "domain"),
    [
        ({"email": "Ada@Campus.Example.EDU", "email_verified": True}, "campus.example.edu"),
        ({"email": "ada@campus.example.edu"}, None),  # not said to be verified
        ({"email": "ada@campus.example.edu", "email_verified": "true"}, None),
        ({"email": "@campus.example.edu", "email_verified": True}, None),
        ({"email": "no-at-sign", "email_verified": True}, None),
        ({}, None),
    ],
)
def test_email_domain_only_of_a_verified_address(
    user_info: dict[str, Any], domain: str | None
) -> None:
    assert email_domain(user_info) == domain


class Keys:
    def __init__(self) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.jwks = {"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}

    def token(self, key: Any = None, kid: str = "k1", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": "hub", "sub": "ada", "iat": now, "exp": now + 300}
        body.update(claims)
        return jwt.encode(body, key or self.private, algorithm="RS256", headers={"kid": kid})


@pytest.fixture
def keys() -> Keys:
    return Keys()


@pytest.fixture
def authenticator(keys: Keys) -> CampusAuthenticator:
    authenticator = CampusAuthenticator(issuer=ISSUER, client_id="hub")
    authenticator._endpoints = ProviderEndpoints.from_document(ISSUER, DOCUMENT)
    fetched: list[str] = []

    async def httpfetch(url: str, **kwargs: Any) -> Any:
        assert url == JWKS, f"unexpected fetch of {url}"
        fetched.append(url)
        return keys.jwks

    authenticator.httpfetch = httpfetch  # type: ignore[method-assign]
    authenticator.fetched = fetched  # type: ignore[attr-defined]
    return authenticator


async def test_a_good_id_token_gives_its_claims(
    authenticator: CampusAuthenticator, keys: Keys
) -> None:
    claims = await authenticator.verified_id_token(keys.token())
    assert claims["sub"] == "ada"
    await authenticator.verified_id_token(keys.token())
    assert authenticator.fetched == [JWKS]  # type: ignore[attr-defined]  # keys are kept


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda k: k.token(aud="another-client"), id="another audience"),
        pytest.param(lambda k: k.token(iss="https://evil.example"), id="another issuer"),
        pytest.param(lambda k: k.token(exp=int(time.time()) - 3600), id="expired"),
        pytest.param(
            lambda k: k.token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            id="another key",
        ),
        pytest.param(lambda k: k.token(kid="unknown"), id="unknown key id"),
        pytest.param(
            lambda k: jwt.encode({"iss": ISSUER, "aud": "hub", "sub": "ada"}, None, "none"),
            id="unsigned",
        ),
        pytest.param(lambda k: None, id="missing"),
    ],
)
async def test_a_forged_or_stale_id_token_is_refused(
    authenticator: CampusAuthenticator, keys: Keys, forge: Any
) -> None:
    with pytest.raises(web.HTTPError) as refused:
        await authenticator.verified_id_token(forge(keys))
    assert refused.value.status_code == 403


async def test_the_id_token_and_userinfo_must_be_about_the_same_user(
    authenticator: CampusAuthenticator, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def userinfo(self: Any, token_info: dict[str, Any]) -> dict[str, Any]:
        return {"sub": "mallory", "preferred_username": "mallory"}

    monkeypatch.setattr(GenericOAuthenticator, "token_to_user", userinfo)
    with pytest.raises(web.HTTPError) as refused:
        await authenticator.token_to_user({"id_token": keys.token(sub="ada")})
    assert refused.value.status_code == 403


async def test_signing_keys_out_of_reach_is_a_503_not_a_refusal(
    authenticator: CampusAuthenticator, keys: Keys
) -> None:
    async def unreachable(url: str, **kwargs: Any) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")

    authenticator.httpfetch = unreachable  # type: ignore[method-assign]
    with pytest.raises(web.HTTPError) as failed:
        await authenticator.verified_id_token(keys.token())
    assert failed.value.status_code == 503
    assert "not answering" in (failed.value.log_message or "")


async def test_a_provider_away_at_login_is_a_503_and_the_next_login_tries_again(
    keys: Keys,
) -> None:
    authenticator = CampusAuthenticator(issuer=ISSUER, client_id="hub")
    answers: list[Any] = [ConnectionRefusedError(111, "Connection refused"), DOCUMENT]

    async def httpfetch(url: str, **kwargs: Any) -> Any:
        assert url == f"{ISSUER}/.well-known/openid-configuration"
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    authenticator.httpfetch = httpfetch  # type: ignore[method-assign]
    with pytest.raises(web.HTTPError) as failed:
        await authenticator.discovered()
    assert failed.value.status_code == 503
    endpoints = await authenticator.discovered()
    assert authenticator.token_url == endpoints.token_url == f"{ISSUER}/token"


@pytest.fixture
def new_account() -> Iterator[str]:
    """A name no account has yet; its account, if made, is removed afterwards."""
    name = f"cs-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=30, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a system account")
async def test_a_new_user_gets_an_account_of_their_own_with_a_private_home(
    tmp_path: Path, new_account: str
) -> None:
    homes = tmp_path / "homes"
    authenticator = CampusAuthenticator(
        issuer=ISSUER, client_id="hub", create_system_users=True, system_user_homes=str(homes)
    )
    await authenticator.add_user(SimpleNamespace(name=new_account))
    account = pwd.getpwnam(new_account)
    assert os.path.dirname(account.pw_dir) == str(homes)
    home = os.stat(account.pw_dir)
    assert (home.st_uid, home.st_mode & 0o777) == (account.pw_uid, 0o700)
    assert grp.getgrgid(account.pw_gid).gr_name == new_account  # a group of its own
    os.chmod(account.pw_dir, 0o750)  # the user shares their home with their group
    await authenticator.add_user(SimpleNamespace(name=new_account))  # at every hub start
    assert pwd.getpwnam(new_account).pw_uid == account.pw_uid
    assert os.stat(account.pw_dir).st_mode & 0o777 == 0o750  # theirs to choose


@pytest.mark.parametrize("name", ["alice@campus.edu", "ünal", "a b", "-x", "1234", "x" * 33])
async def test_a_name_that_cannot_be_an_account_is_refused_at_login(name: str) -> None:
    authenticator = CampusAuthenticator(issuer=ISSUER, client_id="hub", create_system_users=True)
    assert not authenticator.validate_username(name)
    with pytest.raises(web.HTTPError) as refused:
        await authenticator.add_user(SimpleNamespace(name=name))
    assert refused.value.status_code == 500
    assert "could not be set up" in str(refused.value.log_message)
    assert CampusAuthenticator(issuer=ISSUER, client_id="hub").validate_username(name)
