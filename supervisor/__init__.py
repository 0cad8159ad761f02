"""spooled-supervisor: a multiprocess supervisor daemon for Spooled queues."""

__version__ = "0.1.0"
