"""The reviewer's console: a web app in front of the control plane (`ringfence console`).

    app.py        the routes (Starlette), and the rules every route follows
    sessions.py   server-side sessions: the cookie holds a random id, the token stays here
    csrf.py       the checks every state-changing request passes (token + origin)
    headers.py    the security headers (the Content-Security-Policy) on every response
    render.py     the templates (autoescape always on) and their pure helpers
    runview.py    a run's turns, egress decisions and artifacts, from its view and its log
    waterfall.py  the trace's rows for the SVG waterfall (from control.tracing's span tree)
    server.py     uvicorn on a bound socket, and the rule: off loopback, TLS only
    cli.py        the `ringfence console` command
    templates/    the pages; static/ the one script (live inbox) and the one stylesheet

It reaches the control plane only through the public API (the `ringfence` client) with the
signed-in person's token: no store, no orchestration, no authority of its own. docs/console.md.
"""
