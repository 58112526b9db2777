"""The archive inside the real hermes-agent host objects."""
