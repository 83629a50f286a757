"""Orchestration: everything between a proposal and its effect. See facade.py for the map."""

from ringfence_server.control.orchestration.facade import Orchestrator

__all__ = ["Orchestrator"]
