"""The agent's HTTP server: what sits between the socket and the application's routes.

- :mod:`agent.http.protocol`: uvicorn's httptools protocol with the limits it lacks, bodies
  collected whole, and the hook that tells a handler its client is gone;
- :mod:`agent.http.limits`: the server's bounds and the counts its connections share;
- :mod:`agent.http.connection`: what the protocol hands the application through a request's
  scope (the only names of this package a route needs besides :mod:`agent.http.transport`);
- :mod:`agent.http.answers`: what the protocol writes on a connection itself;
- :mod:`agent.http.transport`: bounded body reading, disconnects, JSON answers.

It knows no route: the REST front end (:mod:`agent.api`) imports it, never the other way.
The infer fast path stays with the routes (:mod:`agent.api.fastpath`), since what it does is
the V2 infer route's own work (its path, admission, its handler, the HTTP error table); the
server's side of it, answering from the connection's callbacks, is here
(:class:`agent.http.connection.DirectApp`, :func:`agent.http.answers.respond`).
"""
