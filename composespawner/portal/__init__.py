"""The portal: quotas and the audit log for admins, "my machine" for every user.

A hub-managed service (``composespawner portal``) at ``/services/compose/``,
authenticated with HubOAuth and authorised with ``custom:compose:*`` scopes.
Every page's data is also a JSON call under ``api/`` (see ``docs/portal-api.yaml``).
It reads and changes the ledger only through the ledger's own transactions.

Its parts, as JupyterHub's ``apihandlers``:

- ``handlers/``: a module per resource (me, quotas, cohorts, devices, kits, usage,
  audit), each handler parsing a request, authorising the caller and calling one
  use case; ``handlers/base.py`` holds who is asking and the one ``write_error``
  that maps refusals to statuses; ``handlers/__init__.py`` the routes.
- ``service.py`` (and ``leaderboards.py`` for the starter kits): the use cases,
  over the ledger and the hub's REST API, raising ``errors.py``'s refusals.
- ``views.py`` and ``kit_views.py``: pure functions from request bodies to domain
  values (or an actionable refusal) and from domain values to JSON.
- ``app.py``: the process, wiring the composer, the hub client and the routes.

A new page or call: its use case in ``service.py``, its handler in its resource's
module, its route in ``handlers.ROUTES`` (and, for a call, ``docs/portal-api.yaml``,
which ``tests/e2e/test_portal_schema.py`` checks); its refusals tested in process in
``tests/unit/test_portal_handlers.py``.
"""
