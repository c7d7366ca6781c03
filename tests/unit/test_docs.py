"""The documentation says only what exists: every `turnstile` command in a shell block of the
README and docs/ names a real subcommand and real options (read from the click command tree
the console script runs, not from help text), every benchmark and test file a shell block
names is there with the options it is given, every relative link points to a file (and a
heading) in the repository, every docs page is linked from the README, and every setting is
in the configuration page."""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import typer
from pydantic_settings import BaseSettings
from typer.core import TyperGroup, TyperOption

from turnstile.worker.cli.main import app
from turnstile.worker.http.console.settings import ConsoleSettings
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]  # the README and every docs page
# Shell blocks are also checked in the other READMEs of the repository.
SHELL_PAGES = [*PAGES, ROOT / "deploy" / "README.md", ROOT / "deploy" / "SIZING.md",
               *sorted((ROOT / "examples").glob("*/README.md"))]  # fmt: skip
README_MAX_LINES = 300
FIRST_LINES = ("uv run turnstile demo ", "uv run pytest ")
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "$"}


@dataclass(frozen=True)
class Command:
    """One command of a shell block: its words, and where it was written."""

    page: Path
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        where = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{where}:{self.line}: {' '.join(self.words)}"


def shell_blocks(page: Path) -> Iterator[tuple[int, str]]:
    """Each ```sh (or bash, shell) block of the page, with the line it starts on."""
    text = page.read_text()
    for match in re.finditer(r"^```(?:sh|bash|shell)\n(.*?)^```", text, re.M | re.S):
        yield text.count("\n", 0, match.start()) + 2, match.group(1)


def logical_lines(block: str) -> Iterator[tuple[int, str]]:
    """The block's lines with `\\` continuations and quotes across lines joined, each with
    its offset in the block."""
    pending, start = "", 0
    for offset, line in enumerate(block.splitlines()):
        if not pending:
            start = offset
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote that closes on a later line
            pending += "\n"
            continue
        yield start, pending
        pending = ""
    assert not pending, f"an unfinished line at the end of a block: {pending!r}"


def words_of(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.wordchars += ":@,+%[]{}…"
    return list(lexer)


def commands(page: Path, program: str) -> Iterator[Command]:
    """Every command of the page's shell blocks that runs `program`, as its words after the
    program's name (`uv run` and variable assignments before it are allowed)."""
    for first, block in shell_blocks(page):
        for offset, line in logical_lines(block):
            words = words_of(line)
            at_start = True
            for i, word in enumerate(words):
                if word in SEPARATORS:
                    at_start = True
                elif at_start and word == program:
                    rest = words[i + 1 :]
                    end = next((j for j, w in enumerate(rest) if w in SEPARATORS), len(rest))
                    yield Command(page, first + offset, tuple(rest[:end]))
                    at_start = False
                elif at_start and (re.fullmatch(r"[A-Za-z_]\w*=.*", word) or word == "uv"):
                    continue  # an assignment, or `uv` before `run`
                elif at_start and word == "run" and i > 0 and words[i - 1] == "uv":
                    continue
                else:
                    at_start = False


@cache
def root_command() -> TyperGroup:
    """The command tree the console script runs (Typer's own click, which it vendors)."""
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)
    return command


def _option(command: Any, name: str) -> TyperOption | None:
    for param in command.get_params(typer.Context(command)):
        if isinstance(param, TyperOption) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def _takes_value(param: TyperOption) -> bool:
    return not (param.is_flag or param.count)


def turnstile_problems(words: tuple[str, ...]) -> list[str]:
    """What in `turnstile WORDS` names no command or option of the real command tree."""
    command: Any = root_command()
    path, problems, arguments = ["turnstile"], [], False
    pending = list(words)
    while pending:
        word = pending.pop(0).strip("[]")
        if word.startswith("-") and len(word) > 1:
            name = word.split("=", 1)[0]
            param = _option(command, name)
            if param is None:
                problems.append(f"{' '.join(path)} has no option {name}")
            elif _takes_value(param) and "=" not in word and pending:
                pending.pop(0)
        elif isinstance(command, TyperGroup) and not arguments:
            sub = command.get_command(typer.Context(command), word)
            if sub is None:
                problems.append(f"{' '.join(path)} has no command {word!r}")
                break
            command, path = sub, [*path, word]
        else:
            arguments = True
    if isinstance(command, TyperGroup) and len(path) > 1 and not problems:
        problems.append(f"{' '.join(path)} is a group: name one of its commands")
    return problems


@cache
def bench_options(module: str) -> frozenset[str] | None:
    """The options a benchmark module's argparse parser declares, read from its source;
    None when there is no such module."""
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):  # fmt: skip
            found |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            }
    return frozenset(found | {"--help", "-h"})


def python_problems(words: tuple[str, ...]) -> list[str]:
    """What in `python -m tests.bench.X ...` names no module or no option of it."""
    if len(words) < 2 or words[0] != "-m" or not words[1].startswith("tests."):
        return []
    options = bench_options(words[1])
    if options is None:
        return [f"no module {words[1]}"]
    return [
        f"{words[1]} has no option {w.split('=')[0]}"
        for w in words[2:]
        if w.startswith("--") and w.split("=")[0] not in options
    ]


def pytest_problems(words: tuple[str, ...]) -> list[str]:
    """The test files `pytest ...` names that are not there."""
    named = [w.split("::")[0] for w in words if w.split("::")[0].endswith(".py")]
    return [f"no file {name}" for name in named if not (ROOT / name).is_file()]


def all_problems(pages: list[Path]) -> list[str]:
    problems = []
    for page in pages:
        for program, check in (("turnstile", turnstile_problems), ("python", python_problems),
                               ("pytest", pytest_problems)):  # fmt: skip
            for command in commands(page, program):
                problems += [f"{command}: {p}" for p in check(command.words)]
    return problems


def test_shell_blocks_name_only_commands_and_options_that_exist() -> None:
    """Every `turnstile ...` line names a real subcommand path and real options; every
    benchmark a real module with real options; every test file named exists."""
    checked = [c for page in SHELL_PAGES for c in commands(page, "turnstile")]
    assert len(checked) > 80, "the docs' shell blocks were read"
    assert all_problems(SHELL_PAGES) == []


def test_the_check_refuses_what_does_not_exist(tmp_path: Path) -> None:
    """A misspelt command, an option the command does not have, a group with no command, a
    benchmark option that is not declared and a test file that is not there are each named."""
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\n"
        "turnstile submitt --job x\n"
        'RUN=$(uv run turnstile submit --job x --tenant t --user u --goal "g" --budgte a=1)\n'
        "turnstile ledger\n"
        "turnstile approve RUN --extend steps=5 && turnstile watch RUN --follow\n"
        "uv run python -m tests.bench.bench_worker --rounds 3 --durabilty none\n"
        "uv run python -m tests.bench.bench_nothing\n"
        "uv run pytest tests/unit/test_nothing.py -q\n"
        "```\n"
    )
    assert all_problems([page]) == [
        "page.md:2: submitt --job x: turnstile has no command 'submitt'",
        "page.md:3: submit --job x --tenant t --user u --goal g --budgte a=1: "
        "turnstile submit has no option --budgte",
        "page.md:4: ledger: turnstile ledger is a group: name one of its commands",
        "page.md:5: watch RUN --follow: turnstile watch has no option --follow",
        "page.md:6: -m tests.bench.bench_worker --rounds 3 --durabilty none: "
        "tests.bench.bench_worker has no option --durabilty",
        "page.md:7: -m tests.bench.bench_nothing: no module tests.bench.bench_nothing",
        "page.md:8: tests/unit/test_nothing.py -q: no file tests/unit/test_nothing.py",
    ]


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def link_problems(page: Path) -> list[str]:
    problems = []
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # not in code
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}: {target}"
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{where}: no such heading")
    return problems


def test_relative_links_point_to_files_and_headings_in_the_repository() -> None:
    """Every relative link of the README and docs/ names a file of the repository, and a
    heading of it when it names one."""
    assert [p for page in PAGES for p in link_problems(page)] == []


def test_a_broken_link_is_named(tmp_path: Path) -> None:
    """A link to a missing file, to a missing heading and out of the repository are each
    found (the check bites)."""
    page = DOCS / f"_probe_{tmp_path.name}.md"
    page.write_text(
        "[a](nothing.md) [b](concepts.md#no-such) [c](../../x.md) [d](concepts.md#outcomes)\n"
    )
    try:
        problems = link_problems(page)
    finally:
        page.unlink()
    assert [p.split(": ", 2)[2] for p in problems] == [
        "no such file", "no such heading", "outside the repository"
    ]  # fmt: skip


def test_the_readme_is_a_front_door_linking_every_page() -> None:
    """At most 300 lines; its first lines are the two commands a new user needs; every docs
    page is linked from it; it sends no reader outside the repository."""
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    assert lines[:4] == ["# Turnstile", "", "```sh", lines[3]]
    assert lines[3].startswith(FIRST_LINES[0]) and lines[4].startswith(FIRST_LINES[1])
    assert lines[5] == "```"
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(text)}
    assert [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked] == []
    assert "STYLE.md" not in text and "../" not in text


def test_every_setting_is_in_the_configuration_page() -> None:
    """Each field of Settings, ApiSettings and ConsoleSettings is a row of
    docs/configuration.md, under its environment variable."""
    page = (DOCS / "configuration.md").read_text()
    groups: list[tuple[type[BaseSettings], str]] = [
        (Settings, "TURNSTILE_"),
        (ApiSettings, "TURNSTILE_API_"),
        (ConsoleSettings, "TURNSTILE_CONSOLE_"),
    ]
    missing = [
        f"{prefix}{name.upper()}"
        for settings, prefix in groups
        for name in settings.model_fields
        if f"`{prefix}{name.upper()}`" not in page
    ]
    assert missing == []


def test_the_readme_tool_returns_a_value_and_raises_tool_error() -> None:
    """The README's tool, run as written: its plain dict is the result, an unknown order the
    ToolError it raises."""
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    namespace: dict[str, Any] = {"__name__": "readme_tool"}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    tool = namespace["get_order"]
    from turnstile import ToolContext, ToolError  # noqa: PLC0415

    def call(order_id: str) -> object:
        ctx = ToolContext(run_id="r", tenant="t", user_id="u", params={},
                          args={"order_id": order_id}, key="k", timeout_s=1.0)  # fmt: skip
        return tool.fn(ctx)

    assert call("A-1") == {"order_id": "A-1", "status": "arrived damaged", "paid_cents": 2500}
    try:
        call("B-1")
    except ToolError as exc:
        assert (exc.code, exc.detail) == ("not_found", "no order B-1")
    else:
        raise AssertionError("no ToolError")
