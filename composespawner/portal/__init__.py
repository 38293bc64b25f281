"""The portal: quotas and the audit log for admins, "my machine" for every user.

A hub-managed service (``composespawner portal``) at ``/services/compose/``,
authenticated with HubOAuth and authorised with ``custom:compose:*`` scopes.
Every page's data is also a JSON call under ``api/`` (see ``docs/portal-api.yaml``).
It reads and changes the ledger only through the ledger's own transactions.
"""
