"""Example consumers of the changefeed, run as programs (`python -m csnd.consumers.examples.current_state`)."""

__all__ = ["current_state"]
