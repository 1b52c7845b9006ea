"""Online calibration: the samples served requests make, the live curves fitted from them and
their crossing, exploration, what a worker or a peer replica shares of them, and the live
profile."""
