"""The HTTP client to the servers: keep-alive connections per server, and an answer's head and
body as they arrive."""
