"""scope."""
