"""Object-store backends."""
