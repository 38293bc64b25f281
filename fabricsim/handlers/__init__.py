"""The simulator's tornado request handlers, by resource.

``base``      what every Redfish handler shares (faults, auth, errors, JSON, ``$expand``)
``service``   the version list, ``$metadata``, read-only resources, 404
``sessions``  login sessions
``systems``   systems, block actions, the Compose action, task monitors
``switches``  the test-only ``/sim`` endpoints
"""
