"""Online calibration's core: the samples served requests make (``samples``), the live
curves fitted from them and their crossing (``fit``), the estimator that keeps the window,
fits it and says what to route by (``estimator``), and exploration's turns near the crossover
(``exploration``). No I/O and nothing of the router's: the router feeds it from its requests
(``router.online``), and the benchmarks replay it offline."""
