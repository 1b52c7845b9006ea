"""What the router says of itself: its Prometheus metrics and gauges, the access log, the
decision log, and the OpenTelemetry spans."""
