"""Logging in: the campus's OpenID Connect provider, or the demo's named accounts."""
