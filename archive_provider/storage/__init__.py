"""Storage: the event store, the one writer per database, the spill, and the local witness
(part of the store's open-time proof)."""
