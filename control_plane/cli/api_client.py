"""The operator commands' client of the control plane's REST API.

An operator command finds the control plane as the server finds itself. Its URL is the first of:
``--url``; the host and port of the control plane's own settings when ``--cp-config FILE`` names
them (``EDGEFLEET_CP_HOST``/``EDGEFLEET_CP_PORT`` over the file, as the server reads them);
``EDGEFLEET_URL``; those settings from ``EDGEFLEET_CP_*`` and the defaults
(http://127.0.0.1:8080). Its token is the first of ``--token``, ``--token-file``,
``EDGEFLEET_TOKEN``, ``EDGEFLEET_TOKEN_FILE``. docs/control-plane.md says the same. Every
failure is one ``Error:`` line.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from common.cli import one_line, settings_failure

F = TypeVar("F", bound=Callable[..., Any])
_SEEN = "edgefleet.api."  # ctx.meta keys of the connection options


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[_SEEN + str(param.name)] = value
    return value


def connected(command: F) -> F:
    """The options that say where the control plane is and who asks (read by
    :meth:`Api.connect`), on an operator command."""
    seen: dict[str, Any] = {"expose_value": False, "callback": _remember}
    file = click.Path(exists=True, dir_okay=False, path_type=Path)
    options = (
        click.option(
            "--url",
            envvar="EDGEFLEET_URL",
            help="The control plane's URL (or EDGEFLEET_URL; default: from its settings).",
            **seen,
        ),
        click.option(
            "--cp-config",
            type=file,
            help="The control plane's TOML settings: its host and port give the URL.",
            **seen,
        ),
        click.option(
            "--token", envvar="EDGEFLEET_TOKEN", help="API token (or EDGEFLEET_TOKEN).", **seen
        ),
        click.option(
            "--token-file",
            envvar="EDGEFLEET_TOKEN_FILE",
            type=file,
            help="File holding the API token (or EDGEFLEET_TOKEN_FILE).",
            **seen,
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command


def _settings_url(config_file: Path | None) -> str:
    """Where the control plane of these settings listens, for a client on this machine."""
    from pydantic import ValidationError

    from control_plane.settings import load_settings

    try:
        settings = load_settings(config_file)
    except (ValidationError, FileNotFoundError, tomllib.TOMLDecodeError) as exc:
        raise settings_failure(exc, config_file) from exc
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


class Api:
    """The control plane's REST API for one operator command. Errors are one line each: the
    control plane's own message for a 4xx or 5xx, what failed when it cannot be reached."""

    def __init__(self, url: str, token: str | None, url_from: str, token_from: str) -> None:
        import httpx  # here, not at start-up: every edgefleet command loads this module

        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise click.UsageError(f"{url_from}: not a URL: {url!r} ({exc})") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise click.UsageError(f"{url_from}: expected http://HOST:PORT, got {url!r}")
        if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
            raise click.UsageError(f"{token_from}: not an API token (efp_...)")
        self.url, self.url_from, self.token_from = url.rstrip("/"), url_from, token_from
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # a dead host is known in seconds; an upload or a validation may take minutes
        timeout = httpx.Timeout(600, connect=10)
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    @classmethod
    def connect(cls) -> Api:
        """The API as the current command's connection options (:func:`connected`) find it."""
        ctx = click.get_current_context()

        def given(name: str) -> Any:
            return ctx.meta.get(_SEEN + name)

        def on_command_line(name: str) -> bool:
            return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE

        config_file: Path | None = given("cp_config")
        if given("url") and on_command_line("url"):
            url, url_from = given("url"), "--url"
        elif config_file is not None or not given("url"):
            url = _settings_url(config_file)
            url_from = (
                f"--cp-config {config_file}"
                if config_file
                else "EDGEFLEET_CP_HOST/EDGEFLEET_CP_PORT or their defaults (no --url, "
                "--cp-config or EDGEFLEET_URL)"
            )
        else:
            url, url_from = given("url"), "EDGEFLEET_URL"
        # flags before the environment; a token before a token file
        names = sorted(
            (n for n in ("token", "token_file") if given(n)), key=lambda n: not on_command_line(n)
        )
        token, token_from = None, ""
        if names and names[0] == "token":
            token = given("token")
            token_from = "--token" if on_command_line("token") else "EDGEFLEET_TOKEN"
        elif names:
            path: Path = given("token_file")
            flag = "--token-file" if on_command_line("token_file") else "EDGEFLEET_TOKEN_FILE"
            token_from = f"{flag} {path}"
            try:
                token = path.read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise click.ClickException(f"{token_from}: cannot read it: {exc}") from exc
            if not token:
                raise click.ClickException(f"{token_from}: the file is empty")
        api = cls(url, token, url_from, token_from)
        ctx.call_on_close(api.http.close)
        return api

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._request(method, path, **kwargs)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as exc:
            raise click.ClickException(
                f"{method} {path}: {self.url} answered {resp.status_code} with something that "
                "is not JSON: is it the control plane?"
            ) from exc

    def content(self, path: str, method: str = "GET", **kwargs: Any) -> bytes:
        """The body of a call that answers bytes, not JSON (a captured sample's archive)."""
        body: bytes = self._request(method, path, **kwargs).content
        return body

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            resp = self.http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise click.ClickException(
                f"cannot reach the control plane at {self.url} ({type(exc).__name__}: "
                f"{one_line(str(exc))}); the URL came from {self.url_from}"
            ) from exc
        except httpx.HTTPError as exc:
            raise click.ClickException(
                f"{method} {path} at {self.url} failed ({type(exc).__name__}: "
                f"{one_line(str(exc)) or 'no detail'})"
            ) from exc
        if resp.status_code >= 400:
            raise click.ClickException(self._refusal(resp))
        return resp

    def _refusal(self, resp: Any) -> str:
        """A 4xx or 5xx as one line: status, code and the control plane's message."""
        try:
            body = resp.json()
            message, code = str(body["error"]), str(body.get("code", ""))
        except (ValueError, KeyError, TypeError, AttributeError):  # not the control plane's
            message, code = (resp.text.strip().splitlines() or [resp.reason_phrase])[0][:200], ""
        line = f"{resp.status_code}{f' {code}' if code else ''}: {one_line(message)}"
        if resp.status_code == 401:
            line += (
                f" (token from {self.token_from})"
                if self.token_from
                else " (no token given: --token, --token-file, EDGEFLEET_TOKEN or "
                "EDGEFLEET_TOKEN_FILE)"
            )
        return line
