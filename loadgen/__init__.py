"""The load harness that calibration and the benchmarks share: clients, closed loops,
traces, sweeps, records, progress and the process spawner."""
