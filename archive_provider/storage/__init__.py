"""Storage: the event store, the one writer per database, and the witness."""
