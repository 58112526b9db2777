"""Remote witnesses: who else holds the log's head, outside this machine. The tlog-witness
server and its client, the archive's set of remote witnesses (read from its log) with the
background submitter the host hands the writer, and the peers that cosign each other over
hivemind. The local witness stays in storage: it is part of the store's open-time proof."""
