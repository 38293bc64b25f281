"""Test doubles and helpers used only by the tests.

``inprocess`` (the strict in-process fabric), ``faulty`` (it, with faults on
cue), ``mockserver`` (a static Redfish mockup server). What the benchmarks also
start (a hub, the simulator as a process, PostgreSQL, Kubernetes, a browser, a
test CA) is in the ``harness`` package beside ``tests``.
"""
