"""Real engines for the real-engine stage: environments installed and models made on the spot."""
