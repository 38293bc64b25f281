"""The compute host's agent: what the hub's SSH key may run on a bare compute host.

See :mod:`composespawner.launchers.agent_protocol` for what it is asked, and
``docs/architecture.md`` for where it runs.
"""
