"""The real parts the tests and the benchmarks both start: a hub, the simulator,
PostgreSQL, a kube-apiserver and its process kubelet, a browser, free ports, a test CA.

Tests and benchmarks import it; it imports neither (no cycle between them).
"""
