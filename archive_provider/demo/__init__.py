"""The demo: a scripted walk through a real Hermes agent against a fake LLM."""
