"""Generated from agent.proto (scripts/gen_proto.py); do not edit."""

__all__ = ["agent_pb2", "agent_pb2_grpc"]
