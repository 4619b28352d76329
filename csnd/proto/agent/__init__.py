"""The node agent's wire (csnd.agent.v1): INTERNAL, between csnd's own processes."""

__all__ = ["v1"]
