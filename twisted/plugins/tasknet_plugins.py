"""twistd plugins for the three tasknet roles.

Each plugin is a lazy ``ServiceMaker``: the role's module is imported only when
``twistd`` runs it, so listing plugins stays cheap and one role's import errors
never hide the others.  Every named module defines ``Options`` and
``makeService``.
"""

from twisted.application.service import ServiceMaker

tasknetSite = ServiceMaker(
    "tasknet main site",
    "tasknet.site.root",
    "Main site: HTTP API, web UI, WebSocket, node listener, SQLite.",
    "tasknet-site",
)
tasknetNode = ServiceMaker(
    "tasknet storage node",
    "tasknet.node.service",
    "Storage node: dials the site, downloads, compresses, reports.",
    "tasknet-node",
)
tasknetUpstream = ServiceMaker(
    "tasknet mock upstream",
    "tasknet.upstream.service",
    "Mock non-idempotent archive upstream with fault injection.",
    "tasknet-upstream",
)
