"""Several worker processes as one router: the board they share in memory (loads, readings,
verdicts, the crossover in force) and the processes themselves."""
