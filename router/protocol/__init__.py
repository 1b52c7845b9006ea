"""What every part of the router shares of a request and its answer: what it asked (whichever
HTTP server parsed it), where an answer is written, its id, how it ended, and the OpenAI-
shaped errors."""
