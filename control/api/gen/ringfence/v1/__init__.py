"""Generated from protos/ by `make protos` (control/api/protos_gen.py). Do not edit."""
