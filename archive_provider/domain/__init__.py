"""Pure domain rules: clock, evidence, redaction, memory state and event builders."""
