"""The fleet: the central PostgreSQL store many archives ship to (its schema in
``central.sql``, shipped in the wheel) and the shipper that copies a verified log to it."""
