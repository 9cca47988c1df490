"""Shipped application profiles (the top-level application_profiles/ folder)."""
