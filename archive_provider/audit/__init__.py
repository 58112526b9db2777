"""Audit: export bundles, the log as it stood at a time, replay and projection checks."""
