"""The ringfence egress proxy: its modules are ringfence_server/sandbox/egress/*.py, laid here by the image spec."""
