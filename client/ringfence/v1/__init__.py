"""Generated from protos/ by `make protos` (ringfence_server/control/api/protos_gen.py). Do not edit."""
