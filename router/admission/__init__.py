"""Who may come in and how many at once: the keys, the router-wide slots and their queue, and
the rate limits."""
