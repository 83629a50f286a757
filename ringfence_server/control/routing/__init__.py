"""Supervisor routing: a ticket routed by a sandboxed router to one sandboxed specialist.

    values.py    Ticket and Decision (stdlib only: the SDK decodes into them)
    config.py    the `[routing]` table (taxonomy, router, specialists with their limits, services)
    service.py   TicketRouter: authorize, route, dispatch, and record each decision as a revision
"""
