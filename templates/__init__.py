"""Vendored templates and assets of the HTML report (the top-level templates/ folder)."""
