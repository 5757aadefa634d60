"""Every ``edgefleet ...`` command the README, docs/ and the console's templates show exists, with
the options they give it: a page that names a command the CLI lacks (``edgefleet tokens create``
once, on the login page) fails here.

A command is read where a user would copy it from: a fenced code block, an inline code span or an
HTML ``<code>``, at a command's position (the start, or after ``$``, ``&&``, ``||``, ``;``, ``|``,
``(``; ``.venv/bin/edgefleet`` counts too). The words after ``edgefleet`` walk the click tree as
far as they name subcommands; each ``--option`` after that must be one of the command reached.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest

from common.cli import root

cli_root = cache(root)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "control_plane" / "console" / "templates").rglob("*.html")),
]
FENCE = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.S | re.M)
INDENTED = re.compile(r"(?:^(?: {4}|\t)[^\n]*\n?)+", re.M)
INLINE = re.compile(r"`([^`\n]+)`|<code>(.*?)</code>", re.S)
STARTS = {"$", "&&", "||", ";", "|", "(", "sudo", "exec", "then", "do"}
ENDS = {"&&", "||", ";", "|", ")", "&", ">", ">>", "2>&1", "#"}


@dataclass(frozen=True)
class Named:
    page: str
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: edgefleet {' '.join(self.words)}"


def _snippets(text: str) -> list[tuple[int, str]]:
    """(line number, code) for each code block and inline code span of a page."""
    found: list[tuple[int, str]] = []
    for pattern in (FENCE, INDENTED):
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, m.group(1) if m.groups() else m[0]))
    without_blocks = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    for m in INLINE.finditer(without_blocks):
        code = m.group(1) or m.group(2) or ""
        found.append((without_blocks.count("\n", 0, m.start()) + 1, code))
    return found


def _tokens(code: str) -> list[str]:
    code = re.sub(r"\\\n", " ", code)  # a command continued over lines
    words: list[str] = []
    for line in code.splitlines():
        try:
            words += shlex.split(line, comments=False) + [";"]
        except ValueError:  # prose in a code span, an unclosed quote
            words += line.split() + [";"]
    return words


def named_commands(page: Path) -> list[Named]:
    text = page.read_text()
    named: list[Named] = []
    for line, code in _snippets(text):
        words = _tokens(code)
        for i, word in enumerate(words):
            if not (word == "edgefleet" or word.endswith("bin/edgefleet")):
                continue
            before = words[i - 1] if i else "$"
            if i and before not in STARTS and not before.endswith("="):
                continue
            rest: list[str] = []
            for w in words[i + 1 :]:
                if w in ENDS or w.startswith(("#", ">")):
                    break
                rest.append(w.rstrip(";"))
                if w.endswith(";"):
                    break
            named.append(Named(str(page.relative_to(ROOT)), line, tuple(rest)))
    return named


def _problem(cli: click.Group, words: tuple[str, ...]) -> str | None:
    """What is wrong with ``edgefleet WORDS``, or None. ``a|b`` stands for each of a and b."""
    for i, word in enumerate(words):
        if "|" in word and not word.startswith("-"):
            for alternative in word.split("|"):
                problem = _problem(cli, (*words[:i], alternative, *words[i + 1 :]))
                if problem:
                    return problem
            return None
    command: click.Command = cli
    path = ["edgefleet"]
    args = list(words)
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        word = args.pop(0)
        if word.startswith(("<", "[", "{", "$", "...")) or word.isupper():
            return None  # a placeholder: nothing further to check
        sub = command.commands.get(word)
        if sub is None:
            return f"{' '.join(path)} has no command {word!r}"
        command, path = sub, [*path, word]
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    for word in args:
        if word == "--":
            break  # what follows is another command's line (``launcher run -- agent ...``)
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            if option not in known:
                return f"{' '.join(path)} has no option {option}"
    return None


ALL = [n for page in PAGES for n in named_commands(page)]


def test_the_pages_name_commands_at_all() -> None:
    """The collector finds what the pages show (a collector that found nothing would pass)."""
    assert len(ALL) > 80
    assert any(n.words[:2] == ("fleet", "init") for n in ALL)
    assert any(n.page.endswith(".html") for n in ALL)


def test_a_missing_command_or_option_is_caught() -> None:
    cli = cli_root()
    assert _problem(cli, ("tokens", "create")) == "edgefleet has no command 'tokens'"
    assert _problem(cli, ("rollouts", "status", "1", "--no-such")) is not None
    assert _problem(cli, ("rollouts", "status", "1", "--watch")) is None
    assert _problem(cli, ("rollouts", "pause|resume|nope", "1")) is not None


@pytest.mark.parametrize("named", ALL, ids=str)
def test_every_named_command_exists(named: Named) -> None:
    problem = _problem(cli_root(), named.words)
    assert problem is None, f"{named}: {problem}"
