"""specroute."""
