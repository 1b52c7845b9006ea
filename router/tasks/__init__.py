"""The background loops: the monitor of the servers (health checks, /metrics polls, the
following of what the other workers publish) and the online fits."""
