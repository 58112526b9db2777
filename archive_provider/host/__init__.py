"""The host adapter: the provider Hermes loads, the hermes glue, install, settings, schemas."""
