"""symbols."""
