"""tasknet.upstream: the mock non-idempotent archive upstream.

It stands in for a foreign service, so it imports nothing of the site, the
node or the drills. ``app`` (HTTP API), ``catalog`` (deterministic metadata and
bytes), ``faults`` (fault rules), ``journal`` (counts, charges, journal),
``streaming`` (bodies via a producer), ``service`` (twistd plugin),
``testing`` (``start_upstream`` / ``running_upstream`` for tests).
"""
