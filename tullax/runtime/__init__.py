"""Runtime support shared by the backends: the persistent compile cache (and, later, array exchange)."""
