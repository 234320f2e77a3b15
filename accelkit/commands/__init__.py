"""One module per CLI command. Each exposes a click command named `command` and imports only click and
accelkit.errors at module level, so that `accelkit --help` stays fast."""
