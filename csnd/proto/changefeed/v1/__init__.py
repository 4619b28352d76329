"""Generated from changefeed.proto (scripts/gen_proto.py); do not edit."""
