"""SIGTERM ends a benchmark as Ctrl-C does.

A benchmark starts hubs, proxies, simulators and scratch PostgreSQL databases, and
stops them in ``finally`` blocks and context managers. SIGTERM's default action (a
``timeout`` around ``make bench``, a CI runner cancelling) would kill the process
without running any of them and leave everything behind; as KeyboardInterrupt it
unwinds them like a Ctrl-C.
"""

import signal


def interrupt_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
