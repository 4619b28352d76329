"""Generated from changefeed.proto (scripts/gen_proto.py); do not edit."""

__all__ = ["changefeed_pb2", "changefeed_pb2_grpc"]
