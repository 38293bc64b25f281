"""Test doubles and helpers used only by the tests.

``inprocess`` (the strict in-process fabric), ``faulty`` (it, with faults on
cue), ``simulator`` (the simulator as a process, and its ``/sim`` switches over
HTTP), ``mockserver`` (a static Redfish mockup server), ``tls`` (a test CA).
"""
