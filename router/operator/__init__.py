"""The operator's endpoints: the router's OpenAPI description, the servers' info and loads, the
asks sent to every server (flush the cache, abort a request), the model card and the
engine's profile."""
