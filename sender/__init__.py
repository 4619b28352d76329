"""sender."""
