"""The ringfence egress proxy: its modules are sandbox/egress/*.py, laid here by the image spec."""
