"""The HTTP front: the router's own HTTP/1.1 server for the proxied paths (llhttp parses each
request on the event loop) and aiohttp's server for every other path, with the checks both
make before a request reaches the proxy."""
