"""The services under their earlier names (csnd.v1), deprecated; generated, do not edit."""
