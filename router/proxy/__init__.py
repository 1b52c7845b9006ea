"""A request's path through the router: its body read for the policy, the server chosen, the
call upstream, the answer relayed (a stream with its usage asked for), and the record of how
it went."""
