"""What an operator sees: metrics, the health port, systemd notify, logs and the hooks that feed them."""
