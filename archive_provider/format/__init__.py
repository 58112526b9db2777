"""The archive format: canonical encoding, digests, the event model and the standalone verifier."""
