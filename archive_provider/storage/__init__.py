"""Storage: the event store, the one writer per database, the witness, and the central
PostgreSQL store with the shipper that copies a verified log to it."""
