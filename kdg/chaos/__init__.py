"""`kdg chaos`: real faults on the real cluster, and whether each guarantee held."""
