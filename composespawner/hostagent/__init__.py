"""The compute host's agent: what the hub's SSH key may run on a bare compute host.

See :mod:`composespawner.launchers.agent_protocol` for what it is asked, and
``docs/architecture.md`` for where it runs.

``__main__`` (the ``composespawner-host`` command, sshd's forced command) hands its
channel to ``server`` (``composespawner-host-server``, one long-lived process per host,
``handoff`` says how), whose child for the channel runs ``channel``: it reads the request
and answers (``__main__`` runs ``channel`` itself where no server takes it); ``agent``
checks and dispatches it; ``config`` is the host's TOML; ``decisions``
the pure choices (does it fit, which environment); ``notebooks`` the ops on the
host with ``starting`` (a start's steps), ``accounts`` (whose account),
``stacks`` (the stack's environment) and ``state`` (the records). Every SSH
channel runs a fresh agent process (the server's child, or the forced command): what a
poll imports is kept to the standard library and our lean modules (no JupyterHub,
tornado or traitlets).
"""
