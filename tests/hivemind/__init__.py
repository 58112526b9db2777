"""hivemind against a real Synapse and the real provider."""
