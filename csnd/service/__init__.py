"""The service's gRPC side: the Changefeed over the durable changelog (docs/design.md sections 5, 7, 8).

    Changelog (csnd.changelog) ──► ChangefeedServicer ──► Subscribe / Fetch / Status
         SubscriptionStore (named marks) ◄──┘        │
                                          start_changefeed(): grpc server, bearer token,
                                          TLS, health, reflection, graceful stop

Pure parts beside it: `filtering` (a subscriber's tables applied to a line),
`batching` (whole transactions under a size bound), `registry` (consumers,
their acknowledgements and lag bookkeeping).  `status.StatusSource` is what the
service runtime supplies about its nodes, its totals and its initial snapshot;
`status.build_status` makes the one Status answer of gRPC and /api/status.

Public API: the names in `__all__` (a changefeed server over a changelog,
for tests, bench/ and programs that embed one), and `serve_cmd` (`csnd
serve` and `csnd changelog` for the command line).  Every other module is
the service's own; users reach it over gRPC (csnd.proto.changefeed.v1) and
HTTP (docs/service.md).
"""

from csnd.service.changefeed import ChangefeedServicer, FeedSettings
from csnd.service.server import RunningServer, TlsFiles, start_changefeed
from csnd.service.status import NodesOnly, NodeState, StatusSource, Totals

__all__ = [
    "ChangefeedServicer",
    "FeedSettings",
    "NodeState",
    "NodesOnly",
    "RunningServer",
    "StatusSource",
    "TlsFiles",
    "Totals",
    "serve_cmd",
    "start_changefeed",
]
