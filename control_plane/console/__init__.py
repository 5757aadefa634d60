"""The operator web console, served by the control plane under ``/ui/`` (docs/console.md).

It owns the pages, their templates and the static files they load (htmx, uPlot), the console's
login sessions and its CSRF and Content-Security-Policy rules. It owns no data and no action:
every read and every change is a call of the REST API (``control_plane.api``) with the logged-in
operator's own token, made in-process through the same ASGI application, so the API's checks of
token, role and input apply to the console exactly as to the CLI.
"""
