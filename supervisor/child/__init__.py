"""A child process: its main loop, handler loading and the frames it exchanges with the parent."""
