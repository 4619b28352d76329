"""coordinator."""
