"""The use cases: compose, grow, release, reconcile, and the composition root that wires them."""
