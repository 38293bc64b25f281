"""``composespawner-host``: the forced command of the hub's key on a compute host, as a
console script (:func:`.handoff.main`; the host role runs ``handoff.py`` by path, without
``site``, which starts faster)."""

from __future__ import annotations

import sys

from composespawner.hostagent.handoff import main

if __name__ == "__main__":
    sys.exit(main())
