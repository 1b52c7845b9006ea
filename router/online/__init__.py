"""What the router adds to online calibration's core (``specroute.online``): a served
request's sample, the rings several workers record in, what the leader publishes of its
fit, the peer replicas' samples, the live profile and the gauges."""
