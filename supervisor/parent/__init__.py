"""The parent process: the arbiter loop and the parts it routes between (pool, claiming, settling, membership)."""
