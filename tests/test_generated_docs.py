"""The completions in completions/ and the man pages in man/ are generated from the command line
by scripts/gen_docs.py: they must match what it writes now, and they must work."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_docs.py"
MAN_SECTIONS = ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO")


def _load_gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


gen_docs = _load_gen_docs()


def _generate(out: Path, **env: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        check=True,
        env={**os.environ, **env},
        cwd=out,
        timeout=60,
    )


def _generated_files(base: Path) -> dict[str, str]:
    return {
        str(f.relative_to(base)): f.read_text()
        for d in ("completions", "man")
        if (base / d).is_dir()
        for f in sorted((base / d).iterdir())
        if f.is_file()
    }


def test_committed_files_match_the_command_line(tmp_path: Path) -> None:
    _generate(tmp_path)
    fresh, committed = _generated_files(tmp_path), _generated_files(ROOT)
    problems = []
    for rel in sorted(fresh.keys() | committed.keys()):
        if rel not in committed:
            problems.append(f"{rel}: missing")
        elif rel not in fresh:
            problems.append(f"{rel}: nothing generates it any more")
        elif fresh[rel] != committed[rel]:
            diff = difflib.unified_diff(
                committed[rel].splitlines(),
                fresh[rel].splitlines(),
                f"committed/{rel}",
                f"generated/{rel}",
                lineterm="",
            )
            problems.append("\n".join(list(diff)[:40]))
    assert not problems, (
        "completions/ or man/ is out of date with the command line; run `python scripts/gen_docs.py` "
        "and commit the result:\n" + "\n".join(problems)
    )


def test_output_does_not_depend_on_hash_seed_or_terminal(tmp_path: Path) -> None:
    _generate(tmp_path / "a", PYTHONHASHSEED="1", COLUMNS="40", TERM="dumb")
    _generate(tmp_path / "b", PYTHONHASHSEED="2", COLUMNS="200", TERM="xterm-256color", NO_COLOR="1")
    assert _generated_files(tmp_path / "a") == _generated_files(tmp_path / "b")


def _visible_options() -> dict[tuple[str, ...], tuple[set[str], set[str]]]:
    """Per command path: the option names that must be documented and those that must not."""
    from gpubox.cli.app import app

    found: dict[tuple[str, ...], tuple[set[str], set[str]]] = {}

    def walk(cmd: Any, path: tuple[str, ...], parent: Any) -> None:
        ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent, **cmd.context_settings)
        shown: set[str] = set()
        hidden: set[str] = set()
        for p in cmd.get_params(ctx):
            if p.param_type_name == "option":
                (hidden if p.hidden else shown).update(p.opts, p.secondary_opts)
        found[path] = (shown, hidden)
        for name, sub in getattr(cmd, "commands", {}).items():
            if not sub.hidden:
                walk(sub, (*path, name), ctx)

    walk(typer.main.get_command(app), ("gpubox",), None)
    return found


def _spelled(name: str, file: str) -> str:
    """How an option's name appears in a completion file: fish says `-l once` and `-s i`."""
    if file.endswith(".fish"):
        return f"-l {name[2:]} " if name.startswith("--") else f"-s {name[1:]} "
    return name


def test_every_visible_option_is_documented_and_completed() -> None:
    completions = {
        name: (ROOT / "completions" / name).read_text() for name in ("gpubox.bash", "_gpubox", "gpubox.fish")
    }
    for path, (shown, hidden) in _visible_options().items():
        where = " ".join(path)
        page = ROOT / "man" / f"{'-'.join(path[:2])}.1"
        text = page.read_text()
        for name in shown:
            roff = name.replace("-", "\\-")
            assert f"\\fB{roff}\\fR" in text, f"{name} of {where} is not in {page.name}"
            for file, body in completions.items():
                assert _spelled(name, file) in body, f"{name} of {where} is not in completions/{file}"
        for name in hidden:
            assert name.replace("-", "\\-") not in text, f"hidden {name} is in {page.name}"
            for file, body in completions.items():
                assert _spelled(name, file) not in body, f"hidden {name} is in completions/{file}"


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "man").glob("*.1")))
def test_man_page_has_every_section_and_renders_without_warnings(page: str) -> None:
    text = (ROOT / "man" / page).read_text()
    for section in MAN_SECTIONS:
        assert f".SH {section}\n" in text or f'.SH "{section}"\n' in text, f"{page} has no {section} section"
    # A synopsis says "many" once: ID..., not ID...... (an argument whose name says it already).
    assert not re.search(r"\.\.\.(\\f[BIR])?\.\.\.", text), f"{page} repeats an ellipsis"
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z"], input=text, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0 and not result.stderr.strip(), f"{page}: {result.stderr}"


@pytest.mark.parametrize(("shell", "file"), [("bash", "gpubox.bash"), ("zsh", "_gpubox"), ("fish", "gpubox.fish")])
def test_completion_scripts_parse(shell: str, file: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    result = subprocess.run([shell, "-n", str(ROOT / "completions" / file)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def _bash_complete(script: Path, line: str) -> list[str]:
    """What bash offers after typing `line` (a trailing space starts a new word) and TAB."""
    program = (
        'source "$1"; read -ra COMP_WORDS <<<"$2"; [[ "$2" == *" " ]] && COMP_WORDS+=("");'
        ' COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _gpubox; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program, "_", str(script), line],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return sorted(w for w in out.splitlines() if w)


def test_bash_completes_commands_options_and_skips_option_values() -> None:
    script = ROOT / "completions" / "gpubox.bash"
    assert {"top", "queue", "--help", "--version"} <= set(_bash_complete(script, "gpubox "))
    assert _bash_complete(script, "gpubox t") == ["top"]
    assert "--once" in _bash_complete(script, "gpubox top --")
    assert _bash_complete(script, "gpubox top --interval ") == []  # a number: nothing to offer
    assert _bash_complete(script, "gpubox top -i 2 --js") == ["--json"]
    assert "--demo-gpus" not in _bash_complete(script, "gpubox top --demo")
    # Values gpubox checks itself, not through a Choice type, are offered all the same.
    assert _bash_complete(script, "gpubox queue add --kind ") == ["batch", "infer", "other", "quantize", "train"]
    assert _bash_complete(script, "gpubox queue ls --state r") == ["running"]
    assert _bash_complete(script, "gpubox report --by ") == ["gpu", "job", "kind", "tag", "user"]
    # --cwd names a directory: folders only, where --file takes any file.
    assert _bash_complete(script, "gpubox queue add --cwd /et") == ["/etc"]
    assert _bash_complete(script, "gpubox queue add --cwd /etc/passw") == []
    assert "/etc/passwd" in _bash_complete(script, "gpubox queue add --file /etc/passw")


def test_fish_completes_commands_and_options() -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    script = ROOT / "completions" / "gpubox.fish"

    def complete(line: str) -> set[str]:
        out = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return {row.split("\t")[0] for row in out.splitlines()}

    assert {"top", "queue"} <= complete("gpubox ")
    assert "--once" in complete("gpubox top --")
    assert "--once" in complete("gpubox top -i 2 --")
    assert "--once" not in complete("gpubox queue --")


def _sample_tree() -> Any:
    """A command line with what gpubox's does not have yet: nested groups, arguments, choices, paths."""
    app = typer.Typer(help="Sample [bold]tool[/bold].", add_completion=False)
    jobs = typer.Typer(help="Jobs: add them, list them.")

    @jobs.command("add")
    def add(
        argv: Annotated[list[str], typer.Argument(help="The command and its arguments.")],
        kind: Annotated[
            Literal["train", "infer"], typer.Option("--kind", "-k", help="What it is: it's [x].")
        ] = "train",
        log: Annotated[Path | None, typer.Option("--log", help="Log file.")] = None,
        secret: Annotated[bool, typer.Option("--secret", hidden=True)] = False,
    ) -> None:
        """Queue a job.

        The job runs when its GPUs are free.

        .SH at the start of a paragraph must not become a roff request.
        """

    @jobs.command("ls")
    def ls(json_out: Annotated[bool, typer.Option("--json", help="As JSON.")] = False) -> None:
        """List the jobs."""

    @app.command("plain")
    def plain(path: Annotated[Path, typer.Argument(help="A file.")]) -> None:
        """Look at a file."""

    app.add_typer(jobs, name="jobs")
    return gen_docs.build_tree(typer.main.get_command(app), ("gpubox",))


def test_generator_handles_nested_groups_arguments_and_choices(tmp_path: Path) -> None:
    files = gen_docs.render_all(_sample_tree(), "9.9")
    gen_docs.write(tmp_path, files)
    assert sorted(files) == [
        "completions/_gpubox",
        "completions/gpubox.bash",
        "completions/gpubox.fish",
        "man/gpubox-jobs.1",
        "man/gpubox-plain.1",
        "man/gpubox.1",
    ]
    jobs_page = files["man/gpubox-jobs.1"]
    assert ".SH COMMANDS" in jobs_page and "gpubox jobs add" in jobs_page and "\\-\\-kind" in jobs_page
    assert "\\-\\-secret" not in jobs_page and "[bold]" not in files["man/gpubox.1"]
    assert "\n\\&.SH at the start" in jobs_page
    for shell, file in (("bash", "gpubox.bash"), ("zsh", "_gpubox"), ("fish", "gpubox.fish")):
        if shutil.which(shell):
            result = subprocess.run([shell, "-n", str(tmp_path / "completions" / file)], capture_output=True, text=True)
            assert result.returncode == 0, f"{file}: {result.stderr}"
    if shutil.which("groff"):
        for page in ("gpubox.1", "gpubox-jobs.1", "gpubox-plain.1"):
            result = subprocess.run(
                ["groff", "-man", "-Tutf8", "-ww", "-z", str(tmp_path / "man" / page)], capture_output=True, text=True
            )
            assert not result.stderr.strip(), f"{page}: {result.stderr}"
    script = tmp_path / "completions" / "gpubox.bash"
    assert _bash_complete(script, "gpubox jobs ") == ["--help", "add", "ls"]
    assert _bash_complete(script, "gpubox jobs add --kind ") == ["infer", "train"]
    assert _bash_complete(script, "gpubox jobs add -k t") == ["train"]
    assert "--log" in _bash_complete(script, "gpubox jobs add --")
    assert "--secret" not in _bash_complete(script, "gpubox jobs add --")
