"""The processes: the ``composespawner`` command, the embedded default's files and supervision."""
