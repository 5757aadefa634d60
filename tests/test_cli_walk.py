"""Every ``edgefleet`` command walked with wrong input: missing files, empty directories,
malformed TOML and JSON, malformed selectors and labels, unknown ids, a stopped control plane
and a wrong token. Each answers with an ``Error:`` line as stderr's last line and exit code 1 or
2, never a traceback.

The commands are read from the click tree at run time, so a new command is walked as soon as it
is registered; its cases come from its parameters' types and names. Most run in this process
(click's ``CliRunner``, exceptions not caught: a command that relies on :func:`common.cli.main`'s
safety net fails here), one per top-level command also as the installed console script, and
the servers (``agent``, ``control-plane``, ``demo``) only as processes and only with arguments
that must stop them before they serve.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from common.cli import root
from control_plane.db.models import Device
from control_plane.db.session import sync_url
from runtimes.examples.variants import mlp_version
from tests.control_plane.conftest import PG_ADMIN
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

EXE = Path(sys.executable).parent / "edgefleet"
SERVERS = {("agent",), ("control-plane",), ("demo",), ("launcher", "run")}
"""They serve until stopped: walked as processes, with arguments that must stop them first."""
CONNECTION = {"url", "cp_config", "token", "token_file"}
PAIRS = {"selector", "label", "labels"}
UNKNOWN = {
    "name": "no-such-model",
    "model": "no-such-model",
    "device_id": "no-such-device",
    "from_uri": "models:/no-such-model@champion",  # models sync: an MLflow model to follow
}
UNKNOWN_IDS = {"rollout_id", "device_id", "key_id"}
"""A command taking one of these is given an unknown one: the control plane says 404."""
NAMES_UNKNOWN_MODEL = {("models", "validate"), ("models", "stage"), ("rollouts", "create")}
WALKED_WITH = {
    ("rollouts", "create"): {"model": UNKNOWN["model"], "version": "1"},
    ("bundle", "create"): {"models": f"{UNKNOWN['model']}:1"},
}
"""Options not required (a rollout is of a model or of an agent release) that the walk gives,
so that what is walked is reached."""
WRONG_TOKEN = "efp_wrong_0000000000000000"
SAFE_DEFAULTS = {"--bind": "127.0.0.1", "--owner": getpass.getuser()}
"""Given to the commands that have them, so that what is walked is reached: a broker that
listens on the network without TLS is refused first; the broker's default user may not reach
a temporary directory."""


@dataclass
class Inputs:
    """Wrong (and a few right) things to pass, made once per module."""

    work: Path
    bad_toml: Path
    bad_json: Path
    empty_file: Path
    under_file: Path
    model_dir: Path

    @classmethod
    def make(cls, work: Path) -> Inputs:
        work.mkdir(parents=True, exist_ok=True)
        (work / "bad.toml").write_text('[health\nwindow_s = "x\n')
        (work / "bad.json").write_text('{"labels": [1, }')
        (work / "empty-file").write_text("")
        return cls(
            work=work,
            bad_toml=work / "bad.toml",
            bad_json=work / "bad.json",
            empty_file=work / "empty-file",
            under_file=work / "bad.toml" / "below",
            model_dir=mlp_version(work / "mlp-v1", seed=1),
        )

    @property
    def missing(self) -> Path:
        """A path with nothing there (a new one each time: some commands create what they
        are given)."""
        return self.work / f"missing-{uuid.uuid4().hex[:8]}"

    @property
    def empty_dir(self) -> Path:
        path = self.work / f"empty-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        return path


@dataclass
class Case:
    args: list[str]
    must_fail: bool = False
    says: str = ""
    """What stderr's last line must contain."""
    env: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return " ".join(self.args)


@dataclass
class Stack:
    cp: RunningControlPlane
    db_url: str
    admin: str
    stopped_url: str


def walk(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under ``group``, with its path of names."""
    for name, command in sorted(group.commands.items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from walk(command, (*path, name))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs.make(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A real control plane on SQLite (and its broker); a port with nothing on it."""
    tmp = tmp_path_factory.mktemp("stack")
    broker = Mosquitto(tmp / "broker").start()
    db_url = f"sqlite+aiosqlite:///{tmp}/control-plane.db"
    try:
        with control_plane(tmp / "cp-state", db_url, broker.url, free_port()) as cp:
            admin = (tmp / "cp-state" / "admin-token").read_text().strip()
            yield Stack(cp, db_url, admin, f"http://127.0.0.1:{free_port()}")
    finally:
        broker.stop()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory, and none of the developer's EDGEFLEET_* variables (nor
    MLFLOW_*: ``models sync`` would resolve its source against that registry)."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(("EDGEFLEET_", "MLFLOW_")):
            monkeypatch.delenv(name)
    return tmp_path


def filler(param: click.Parameter, inputs: Inputs) -> str:
    """A value for a required parameter that lets the command go on to what is walked."""
    name = str(param.name)
    if isinstance(param.type, click.Choice):
        return str(param.type.choices[0])
    if name == "variants":
        return str(inputs.model_dir)
    if name in PAIRS:
        return "ring=canary"
    if isinstance(param.type, click.Path):
        if param.type.exists:
            return str(inputs.empty_dir if param.type.dir_okay else inputs.empty_file)
        return str(inputs.work / f"out-{uuid.uuid4().hex[:8]}")
    if isinstance(param.type, click.types.IntParamType):
        return "99999" if name in UNKNOWN_IDS else "1"
    if isinstance(param.type, click.types.FloatParamType):
        return "1"
    return UNKNOWN.get(name, "no-such-key" if name == "key_id" else "walker")


def cases_for(path: tuple[str, ...], command: click.Command, inputs: Inputs, st: Stack) -> list:
    """The wrong inputs for one command, from its parameters."""
    params = [p for p in command.params if p.name not in CONNECTION and p.name != "help"]
    connected = any(p.name == "url" for p in command.params)
    base = {str(p.name): filler(p, inputs) for p in params if p.required}
    base |= WALKED_WITH.get(path, {})
    if "variants" in base:  # a push creates its model: another than the one that stays unknown
        base["name"] = f"walked-{uuid.uuid4().hex[:8]}"

    safe = [
        arg
        for p in params
        if isinstance(p, click.Option) and p.opts[0] in SAFE_DEFAULTS
        for arg in (p.opts[0], SAFE_DEFAULTS[p.opts[0]])
    ]

    def argv(without: str = "", **values: str) -> list[str]:
        merged = {**base, **values}
        out: list[str] = [*path, *safe]
        for p in params:
            if p.name in merged and p.name != without:
                if isinstance(p, click.Option):
                    out += [p.opts[0], merged[str(p.name)]]
                else:
                    out.append(merged[str(p.name)])
        return out

    # local checks run first: a stopped control plane behind them is never reached
    stopped = ["--url", st.stopped_url] if connected else []
    cases = [Case([*path, "--no-such-option"], must_fail=True, says="No such option")]
    for name in base:  # each required parameter left out
        cases.append(Case(argv(without=name), must_fail=True))
    for p in params:
        name = str(p.name)
        if isinstance(p, click.Option) and p.is_flag:
            continue
        if isinstance(p.type, click.Path):
            for bad in (inputs.missing, inputs.empty_dir, inputs.bad_toml, inputs.bad_json):
                cases.append(Case([*argv(**{name: str(bad)}), *stopped]))
            cases.append(Case([*argv(**{name: str(inputs.under_file)}), *stopped]))
            if p.type.exists:
                cases.append(Case([*argv(**{name: str(inputs.missing)})], must_fail=True))
        elif isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType)):
            cases.append(Case(argv(**{name: "abc"}), must_fail=True, says="abc"))
        elif isinstance(p.type, click.Choice):
            cases.append(Case(argv(**{name: "bogus"}), must_fail=True, says="bogus"))
        elif name in PAIRS:
            for bad in ("site", "=lab"):
                cases.append(Case(argv(**{name: bad}), must_fail=True, says=repr(bad)))
        elif name == "variants":
            for bad in (inputs.missing, inputs.empty_dir, inputs.bad_toml):
                cases.append(Case(argv(**{name: str(bad)}), must_fail=True, says=str(bad)))
    if not connected:
        return [*cases, Case(argv())]  # as it is, from an empty directory
    live = ["--url", st.cp.url]
    unknown = path in NAMES_UNKNOWN_MODEL or any(str(p.name) in UNKNOWN_IDS for p in params)
    return [
        *cases,
        Case(
            [*argv(), *stopped],
            must_fail=True,
            says=f"cannot reach the control plane at {st.stopped_url} (",
        ),
        Case([*argv(), *live, "--token", WRONG_TOKEN], must_fail=True, says="401"),
        Case([*argv(), *live], must_fail=True, says="401"),  # no token at all
        Case(
            [*argv(), *live],
            must_fail=True,
            says="EDGEFLEET_TOKEN_FILE",
            env={"EDGEFLEET_TOKEN_FILE": str(inputs.bad_json)},
        ),
        Case([*argv(), *live, "--token-file", str(inputs.empty_file)], must_fail=True),
        Case([*argv(), "--url", "not a url"], must_fail=True, says="--url"),
        Case([*argv(), "--cp-config", str(inputs.missing)], must_fail=True, says="--cp-config"),
        Case([*argv(), "--token-file", str(inputs.empty_dir)], must_fail=True, says="directory"),
        Case([*argv(), "--cp-config", str(inputs.bad_toml)], must_fail=True, says="bad.toml"),
        # unknown ids: a 404 in one line; the others (lists, a new version) just work
        Case([*argv(), *live, "--token", st.admin], must_fail=unknown, says=" 404 " * unknown),
    ]


def server_cases(path: tuple[str, ...], command: click.Command, inputs: Inputs) -> list[Case]:
    """What must stop a server before it serves: its settings file, a bad port or choice."""
    cases = [Case([*path, "--no-such-option"], must_fail=True)]
    for p in command.params:
        name = str(p.name)
        if name == "config_file":
            for bad in (inputs.missing, inputs.empty_dir, inputs.bad_toml, inputs.bad_json):
                cases.append(Case([*path, p.opts[0], str(bad)], must_fail=True))
        elif name == "port":
            cases += [Case([*path, "--port", v], must_fail=True) for v in ("abc", "70000")]
        elif isinstance(p.type, click.Choice):
            cases.append(Case([*path, p.opts[0], "bogus"], must_fail=True))
        elif name == "workdir":
            cases.append(Case([*path, p.opts[0], str(inputs.bad_toml)], must_fail=True))
    return cases


def check(case: Case, exit_code: int, stdout: str, stderr: str) -> None:
    said = f"$ edgefleet {case}\n--- exit {exit_code}\n{stdout}\n--- stderr\n{stderr}"
    assert "Traceback" not in stdout + stderr, said
    if case.must_fail:
        assert exit_code != 0, said
    if exit_code == 0:
        return
    assert exit_code in (1, 2), said
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    assert last.startswith("Error: "), said
    assert case.says in last, said


def run_in_process(cli: click.Group, case: Case) -> None:
    result = CliRunner().invoke(cli, case.args, env=case.env, catch_exceptions=False)
    check(case, result.exit_code, result.stdout, result.stderr)


def run_installed(case: Case, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")} | case.env
    # this checkout's code behind the installed script (an editable install may point at
    # another checkout of the project)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [str(EXE), *case.args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )
    check(case, done.returncode, done.stdout, done.stderr)


def test_every_command_answers_wrong_input_with_one_error_line(
    inputs: Inputs, stack: Stack, workdir: Path
) -> None:
    cli = root()
    walked, as_process = set(), set()
    for path, command in walk(cli):
        walked.add(path)
        if path in SERVERS:
            for case in server_cases(path, command, inputs):
                run_installed(case, workdir)
            as_process.add(path[0])
            continue
        if isinstance(command, click.Group):
            run_in_process(cli, Case([*path, "--no-such-option"], must_fail=True))
            continue
        cases = cases_for(path, command, inputs, stack)
        for case in cases:
            run_in_process(cli, case)
        if path[0] not in as_process:  # the real entry point too, once per top-level command
            run_installed([c for c in cases if c.must_fail and c.says][-1], workdir)
            as_process.add(path[0])
    # the tree is what is walked: the commands this test was written against are all there
    expected = {
        ("models", "push"),
        ("rollouts", "create"),
        ("rollouts", "list"),
        ("devices", "label"),
        ("keys", "revoke"),
        ("control-plane", "token"),
        ("fleet", "add-device"),
        ("hardware",),
        ("agent",),
        ("demo",),
    }
    assert expected <= walked, expected - walked
    assert as_process == {p[0] for p in walked}


TOKEN = ["token", "--name", "n", "--role", "admin"]


def test_known_tracebacks_are_now_one_error_line(inputs: Inputs, workdir: Path) -> None:
    """The cases that printed a traceback before (issue 35), as the installed command."""
    push = ["models", "push", "mlp", "1"]
    cases = [
        Case([*push, str(inputs.missing)], must_fail=True, says="is not a directory"),
        Case([*push, str(inputs.empty_dir)], must_fail=True, says="no model file in"),
        Case(
            [*push, str(inputs.model_dir), "--config", str(inputs.bad_toml)],
            must_fail=True,
            says="bad.toml",
        ),
        Case(
            ["rollouts", "create", "--model", "m", "--version", "1", "--selector", "site"],
            must_fail=True,
            says="expected label=value, got 'site'",
        ),
        Case(["devices", "label", "X", "site"], must_fail=True, says="got 'site'"),
        Case(
            ["control-plane", "--config", str(inputs.missing), "token", "--name", "n"],
            must_fail=True,
            says="Missing option '--role'",
        ),
        Case(
            [*("control-plane", "--config", str(inputs.missing)), *TOKEN],
            must_fail=True,
            says="does not exist",
        ),
        Case(
            ["control-plane", "--config", str(inputs.bad_toml), *TOKEN],
            must_fail=True,
            says="bad.toml: Expected ']'",
        ),
        Case(["agent", "--config", str(inputs.bad_toml)], must_fail=True, says="bad.toml"),
        Case(["control-plane", "--db", "nonsense"], must_fail=True, says="db_url"),
    ]
    for case in cases:
        run_installed(case, workdir)


BOOM = """
import sys
import click
import common.cli

made = common.cli.root


def root(invoked=None):
    cli = made(invoked)

    @cli.command("boom")
    def boom():
        raise RuntimeError("line one\\nline two")

    return cli


common.cli.root = root
sys.argv = ["edgefleet", *sys.argv[1:]]
common.cli.main()
"""


@pytest.mark.parametrize("debug", ["", "--debug", "EDGEFLEET_DEBUG"])
def test_the_safety_net_shows_a_traceback_only_when_asked(debug: str, workdir: Path) -> None:
    """A command that lets an exception through (there should be none): one line, exit 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")}
    if debug == "EDGEFLEET_DEBUG":
        env["EDGEFLEET_DEBUG"] = "1"
    argv = [sys.executable, "-c", BOOM, *(["--debug"] if debug == "--debug" else []), "boom"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == "Error: RuntimeError: line one line two"
    assert ("Traceback" in done.stderr) is bool(debug), done.stderr


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(root(), list(args), env=env, catch_exceptions=False)


def test_the_control_plane_is_found_as_the_server_finds_itself(stack: Stack, workdir: Path) -> None:
    """URL: --url, else --cp-config's host and port, else EDGEFLEET_URL, else EDGEFLEET_CP_*
    and the defaults. Token: --token, --token-file, EDGEFLEET_TOKEN, EDGEFLEET_TOKEN_FILE."""
    port = stack.cp.url.rsplit(":", 1)[1]
    config = workdir / "control-plane.toml"
    config.write_text(f'host = "0.0.0.0"\nport = {port}\n')  # listening everywhere: loopback
    token_file = workdir / "token"
    token_file.write_text(stack.admin + "\n")
    dead = {"EDGEFLEET_URL": stack.stopped_url}
    listed = ["models", "list", "--json"]

    def ok(*args: str, env: dict[str, str] | None = None) -> None:
        result = invoke(*listed, *args, env=env)
        assert result.exit_code == 0, result.stderr
        assert isinstance(json.loads(result.stdout), list)

    def refused(says: str, *args: str, env: dict[str, str] | None = None) -> None:
        result = invoke(*listed, *args, env=env)
        assert result.exit_code == 1 and says in result.stderr, result.stderr

    ok("--cp-config", str(config), "--token-file", str(token_file), env=dead)
    refused("the URL came from EDGEFLEET_URL", "--token", stack.admin, env=dead)
    refused("the URL came from --url", "--url", stack.stopped_url, "--cp-config", str(config))
    ok("--token", stack.admin, env={"EDGEFLEET_CP_PORT": port})  # the server's own variable
    ok("--url", stack.cp.url, env={"EDGEFLEET_TOKEN_FILE": str(token_file)})
    # a flag before the environment; --token before --token-file
    wrong = workdir / "wrong-token"
    wrong.write_text(WRONG_TOKEN)
    ok("--url", stack.cp.url, "--token-file", str(token_file), env={"EDGEFLEET_TOKEN": "efp_x"})
    refused(
        "(token from --token)",
        *("--url", stack.cp.url, "--token", WRONG_TOKEN, "--token-file", str(token_file)),
    )
    refused(
        f"(token from EDGEFLEET_TOKEN_FILE {wrong})",
        *("--url", stack.cp.url),
        env={"EDGEFLEET_TOKEN_FILE": str(wrong)},
    )


def test_token_needs_the_database_the_control_plane_uses(stack: Stack, workdir: Path) -> None:
    """Run from another directory, the default SQLite path names a file that does not exist:
    refused (nothing created) unless --create; the running control plane's own works."""
    make = ["token", "--name", "walker", "--role", "viewer"]
    refused = invoke("control-plane", *make)
    default = workdir / "var" / "control-plane" / "edgefleet.db"
    assert refused.exit_code == 1 and not default.exists()
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(f"Error: no control plane database in the SQLite file {default}: ")
    ), refused.stderr
    assert "--create" in refused.stderr and "--config FILE" in refused.stderr

    made = invoke("control-plane", "--db", stack.db_url, *make, "--json")
    assert made.exit_code == 0, made.stderr
    doc = json.loads(made.stdout)
    assert doc["name"] == "walker" and doc["role"] == "viewer"
    listed = invoke("models", "list", "--url", stack.cp.url, "--token", doc["token"])
    assert listed.exit_code == 0, listed.stderr  # a token the running control plane accepts

    created = invoke("control-plane", *make, "--create")
    assert created.exit_code == 0 and created.stdout.startswith("efp_"), created.stderr
    assert default.is_file()


def test_token_refuses_a_postgresql_database_without_the_schema(workdir: Path) -> None:
    name = f"edgefleet_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        make = ["control-plane", "--db", url, "token", "--name", "w", "--role", "admin"]
        refused = invoke(*make)
        assert refused.exit_code == 1, refused.stderr
        assert f"no control plane database in {url}:" in refused.stderr
        assert invoke(*make, "--create").exit_code == 0
        assert invoke(*make).exit_code == 0
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_json_on_every_command_that_reads_or_creates(
    stack: Stack, inputs: Inputs, workdir: Path
) -> None:
    """Each prints one JSON document on stdout; ``rollouts create`` the rollout with its id."""
    engine = create_engine(sync_url(stack.db_url))
    with Session(engine) as s, s.begin():
        s.merge(Device(id="json-dev", hardware_profile="generic-x86_64", reported_labels={}))
    engine.dispose()
    api = ["--url", stack.cp.url, "--token", stack.admin]

    def doc(*args: str, connected: bool = True) -> Any:
        result = invoke(*args, "--json", *(api if connected else []))
        assert result.exit_code == 0, f"{args}: {result.stderr}"
        return json.loads(result.stdout)

    pushed = doc("models", "push", "jsonmodel", "1", str(inputs.model_dir))
    assert pushed["model"] == "jsonmodel" and pushed["golden"]["name"] == "golden.npz"
    assert doc("models", "validate", "jsonmodel", "1")["passed"]
    assert doc("models", "stage", "jsonmodel", "1", "production")["stage"] == "production"
    assert any(m["name"] == "jsonmodel" for m in doc("models", "list"))
    labelled = doc("devices", "label", "json-dev", "ring=json")
    assert labelled["operator_labels"] == {"ring": "json"}
    assert [d["id"] for d in doc("devices", "list", "--label", "ring=json")] == ["json-dev"]
    create = ["rollouts", "create", "--model", "jsonmodel", "--version", "1"]
    created = doc(*create, "--selector", "ring=json", "--waves", "100%")
    assert isinstance(created["id"], int) and created["model"] == "jsonmodel"
    assert doc("rollouts", "status", str(created["id"]))["id"] == created["id"]
    assert created["id"] in [r["id"] for r in doc("rollouts", "list")]
    assert doc("rollouts", "cancel", str(created["id"]))["state"] == "cancelled"
    rotated = doc("keys", "rotate")
    assert rotated["signing_key"]
    state = ["--state-dir", str(workdir / "state")]
    issued = doc("fleet", "add-device", "json-dev", *state, connected=False)
    assert issued["device_id"] == "json-dev" and len(issued["password"]) >= 40
