"""Log in with the campus identity: any OpenID Connect provider, found by its issuer.

:class:`CampusAuthenticator` is OAuthenticator's GenericOAuthenticator (the
authorization code flow with PKCE, user data from the provider's userinfo
endpoint, JupyterHub groups from a claim with ``manage_groups``) plus what a
public hub wants and the generic one does not do:

- the provider's endpoints from its discovery document, read at the first
  login after the hub starts (not in the config file: the hub, its services
  and ``upgrade-db`` start while the provider is away), so a site configures
  an issuer, a client id and a secret (CILogon, Keycloak, Azure AD and Google
  all publish one);
- the ID token checked: signed by a key in the provider's JWKS, issued by the
  configured issuer to this client, not expired, and about the same subject
  as the userinfo answer (OpenID Connect Core 3.1.3.7 and 5.3.2);
- ``allowed_domains``: anyone whose verified e-mail address is at one of the
  campus's domains may log in, beside ``allowed_users`` and ``allowed_groups``.

With ``manage_groups`` a user's JupyterHub groups are replaced by the
provider's at every login: cohorts and co-located devices follow the provider.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthLoginHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Bool, Set, Unicode

from composespawner.launchers.accounts import AccountError, ensure_user_account, is_account_name

DISCOVERY_TIMEOUT = 10.0  # seconds
CLOCK_SKEW = 60  # seconds of leeway on the ID token's times
NOT_ANSWERING = "The campus login is not answering. Try again in a few minutes."


class DiscoveryFailed(Exception):
    """The issuer's discovery document could not be read; the message says why."""


@dataclass(frozen=True, slots=True)
class ProviderEndpoints:
    """What a hub needs of a provider's discovery document."""

    issuer: str
    authorize_url: str
    token_url: str
    userdata_url: str
    jwks_uri: str
    signing_algorithms: tuple[str, ...]

    @classmethod
    def from_document(cls, issuer: str, document: dict[str, Any]) -> ProviderEndpoints:
        """Check a discovery document against the issuer it was fetched for."""
        if document.get("issuer") != issuer:
            raise DiscoveryFailed(
                f"{issuer} calls itself {document.get('issuer')!r}: configure the issuer"
                " exactly as the provider names it (scheme, host, path, trailing slash)."
            )
        fields = {}
        for key in (
            "authorization_endpoint",
            "token_endpoint",
            "userinfo_endpoint",
            "jwks_uri",
        ):
            value = document.get(key)
            if not isinstance(value, str) or not value.startswith("https://"):
                raise DiscoveryFailed(f"{issuer}'s discovery document has no https {key}")
            fields[key] = value
        algorithms = document.get("id_token_signing_alg_values_supported") or ["RS256"]
        usable = tuple(
            a for a in algorithms if a != "none" and a in jwt.algorithms.get_default_algorithms()
        )
        if not usable:
            raise DiscoveryFailed(
                f"{issuer} signs ID tokens with nothing this hub checks: {algorithms}"
            )
        return cls(
            issuer=issuer,
            authorize_url=fields["authorization_endpoint"],
            token_url=fields["token_endpoint"],
            userdata_url=fields["userinfo_endpoint"],
            jwks_uri=fields["jwks_uri"],
            signing_algorithms=usable,
        )


def email_domain(user_info: dict[str, Any]) -> str | None:
    """The domain of a verified e-mail address in ``user_info`` (lower case), if any.

    A provider that does not say whether it verified the address is not trusted
    with it: anyone can type an address into a self-service account.
    """
    email = user_info.get("email")
    if not isinstance(email, str) or user_info.get("email_verified") is not True:
        return None
    local, at, domain = email.rpartition("@")
    return domain.lower() if at and local and domain else None


class DiscoveringLoginHandler(OAuthLoginHandler):
    """The login redirect, once the provider's endpoints are known."""

    async def get(self) -> None:
        await self.authenticator.discovered()
        super().get()


class CampusAuthenticator(GenericOAuthenticator):
    """Log in through the campus's OpenID Connect provider (see the module's docs)."""

    login_handler = DiscoveringLoginHandler

    issuer = Unicode(
        config=True,
        help="""The provider's issuer, exactly as its discovery document names it
        (https://cilogon.org, https://login.example.edu/realms/campus). Its
        endpoints and signing keys come from the discovery document; the ID
        token's ``iss`` must match it.""",
    )
    allowed_domains = Set(
        Unicode(),
        config=True,
        help="""Allow anyone whose e-mail address, verified by the provider, is at
        one of these domains (e.g. {"example.edu"}); subdomains are not included.
        Beside allowed_users and allowed_groups.""",
    )

    create_system_users = Bool(
        False,
        config=True,
        help="""Give each user a system account of their own at their first login (and
        at the hub's start, for users it knows), with a home under system_user_homes
        that only they may enter: the local launcher runs their notebooks as that
        account, so no user can read or signal another's. Needs a root hub. Names
        that cannot be account names are refused at login.""",
    )
    system_user_homes = Unicode(
        "/home",
        config=True,
        help="Where create_system_users makes the users' homes (useradd --base-dir).",
    )

    _endpoints: ProviderEndpoints | None = None
    _discovering: asyncio.Lock | None = None
    _signing_keys: dict[str, jwt.PyJWK] | None = None

    async def discovered(self) -> ProviderEndpoints:
        """The provider's endpoints, from its discovery document at the first need.

        Fails the request with 503 while the provider does not answer; the next
        login tries again.
        """
        if self._discovering is None:
            self._discovering = asyncio.Lock()
        async with self._discovering:
            if self._endpoints is None:
                self._endpoints = await self._discover()
                self.authorize_url = self._endpoints.authorize_url
                self.token_url = self._endpoints.token_url
                self.userdata_url = self._endpoints.userdata_url
        return self._endpoints

    async def _discover(self) -> ProviderEndpoints:
        if not self.issuer.startswith("https://"):
            raise web.HTTPError(500, "The hub's identity provider is not configured (issuer).")
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            document = await self.httpfetch(
                url,
                label="reading the provider's discovery document",
                request_timeout=DISCOVERY_TIMEOUT,
                connect_timeout=DISCOVERY_TIMEOUT,
            )
            return ProviderEndpoints.from_document(self.issuer, document)
        except (OSError, ValueError, HTTPClientError, DiscoveryFailed) as e:
            self.log.error("Cannot use the identity provider %s: %s", self.issuer, e)
            raise web.HTTPError(503, NOT_ANSWERING) from e

    async def authenticate(self, handler: web.RequestHandler, data: Any = None) -> Any:
        await self.discovered()  # a callback can be a restarted hub's first request
        return await super().authenticate(handler, data)

    async def token_to_user(self, token_info: dict[str, Any]) -> dict[str, Any]:
        user_info: dict[str, Any] = await super().token_to_user(token_info)
        claims = await self.verified_id_token(token_info.get("id_token"))
        if claims.get("sub") != user_info.get("sub"):
            self.log.warning(
                "ID token for %r but userinfo for %r", claims.get("sub"), user_info.get("sub")
            )
            raise web.HTTPError(403, "The identity provider's answers disagree: log in again.")
        return user_info

    async def verified_id_token(self, id_token: Any) -> dict[str, Any]:
        """The ID token's claims once its signature, issuer, audience and times check out."""
        if not isinstance(id_token, str):
            raise web.HTTPError(403, "The identity provider sent no ID token: log in again.")
        try:
            kid = jwt.get_unverified_header(id_token).get("kid")
            endpoints = await self.discovered()
            key = await self._signing_key(endpoints.jwks_uri, kid)
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key,
                algorithms=list(endpoints.signing_algorithms),
                audience=self.client_id,
                issuer=self.issuer,
                leeway=CLOCK_SKEW,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except (jwt.PyJWTError, KeyError) as e:
            self.log.warning("Refused an ID token from %s: %s", self.issuer, e)
            raise web.HTTPError(403, "The identity provider's ID token did not check out.") from e
        return claims

    async def _signing_key(self, jwks_uri: str, kid: str | None) -> jwt.PyJWK:
        """The provider's key ``kid``; the keys are read again once for a kid not seen yet
        (the provider rolled its keys)."""
        for fresh in (False, True):
            if fresh or self._signing_keys is None:
                try:
                    document = await self.httpfetch(jwks_uri, label="reading the signing keys")
                except (OSError, ValueError, HTTPClientError) as e:
                    self.log.error("Cannot read %s's signing keys: %s", self.issuer, e)
                    raise web.HTTPError(503, NOT_ANSWERING) from e
                keys = jwt.PyJWKSet.from_dict(document).keys
                self._signing_keys = {k.key_id or "": k for k in keys if k.public_key_use != "enc"}
            keys_now = self._signing_keys
            if kid in keys_now:
                return keys_now[kid]
            if kid is None and len(keys_now) == 1:
                return next(iter(keys_now.values()))
        raise KeyError(f"no signing key {kid!r} at {jwks_uri}")

    async def check_allowed(self, username: str, auth_model: dict[str, Any] | None) -> bool:
        if await super().check_allowed(username, auth_model):
            return True
        if auth_model is None or not self.allowed_domains:
            return False
        user_info = (auth_model.get("auth_state") or {}).get(self.user_auth_state_key) or {}
        return email_domain(user_info) in {d.lower() for d in self.allowed_domains}

    def validate_username(self, username: str) -> bool:
        if self.create_system_users and not is_account_name(username):
            self.log.warning(
                "Refused %r: it cannot be a system account's name; choose another"
                " username_claim (or username_map) for this provider",
                username,
            )
            return False
        return bool(super().validate_username(username))

    async def add_user(self, user: Any) -> None:
        if self.create_system_users:
            homes = Path(self.system_user_homes)
            try:
                await asyncio.to_thread(ensure_user_account, user.name, homes)
            except AccountError as e:
                self.log.error("No system account for %s: %s", user.name, e)
                raise web.HTTPError(
                    500, "Your account on this hub could not be set up: the admins are told why."
                ) from e
        super().add_user(user)
