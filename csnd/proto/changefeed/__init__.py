"""The changefeed (csnd.changefeed.v1): the public gRPC contract consumers read."""

__all__ = ["v1"]
