"""Generated from agent.proto (scripts/gen_proto.py); do not edit."""
