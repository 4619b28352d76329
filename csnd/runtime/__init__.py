"""The runtime: the stages wired into running pipelines, for `csnd replay`, `csnd node` and the service.

    NodeInput (inputs.NodePipeline: reader -> decoder pool -> sender, in a thread;
               remote.RemoteNode: a node agent over gRPC)
        └─ Outbox of items (items) ─► Merger (merger) ─► Sink (sinks; jsonsink)
                                         └─ ConfirmTracker (confirm) ─► confirm each slot

`options` holds what a run is asked to do (built by the command line), `sources`
turns SOURCE arguments into readers, `replay` wires one `csnd replay`, `agent`
serves one node to a coordinator (its unacknowledged window: `window`),
`replay_progress` and `stopping` are the command line's manners while a run lasts.

Nothing is imported here: each command imports the modules it needs (the
decoders' fork server starts loading while the command line imports these).

Public API (for the command line and the service, not for users): the
modules in `__all__`.  `items`, `jsonsink`, `replay_progress` and `window`
are the runtime's own.
"""

__all__ = [
    "agent",
    "confirm",
    "inputs",
    "logsetup",
    "merger",
    "options",
    "remote",
    "replay",
    "sinks",
    "slot_cmd",
    "sources",
    "stats",
    "stopping",
]
