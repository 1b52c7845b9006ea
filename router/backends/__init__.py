"""The servers behind the router: each one's state and readings (its /metrics), its health
checks and verdicts, the roster of those in service, and where they are found."""
