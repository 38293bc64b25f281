"""The compute host's agent: what the hub's SSH key may run on a bare compute host.

See :mod:`composespawner.launchers.agent_protocol` for what it is asked, and
``docs/architecture.md`` for where it runs.

``__main__`` (the ``composespawner-host`` command) reads the request and answers;
``agent`` checks and dispatches it; ``config`` is the host's TOML; ``decisions``
the pure choices (does it fit, which environment); ``notebooks`` the ops on the
host with ``starting`` (a start's steps), ``accounts`` (whose account),
``stacks`` (the stack's environment) and ``state`` (the records). Every SSH
channel runs a fresh agent: what a poll imports is kept to the standard library
and our lean modules (no JupyterHub, tornado or traitlets).
"""
