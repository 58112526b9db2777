"""Projections: read models rebuilt from the log, and the queries over them."""
