"""What the pool, a request and a quota are, and the decisions on them: pure, no I/O.

Imports nothing else of composespawner."""
