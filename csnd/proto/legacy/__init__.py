"""The services under their earlier names (csnd.v1), deprecated; generated, do not edit."""

__all__ = ["agent_pb2", "agent_pb2_grpc", "changefeed_pb2", "changefeed_pb2_grpc"]
