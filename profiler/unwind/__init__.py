"""unwind."""
