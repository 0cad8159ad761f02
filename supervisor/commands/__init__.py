"""The subcommands: run (the daemon), demo, enqueue and status; each exposes main(argv) -> int."""
