"""The package itself: wheel contents, resource lookup, fast start-up, error handling of the entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest
from helpers import REPO_ROOT, run_accelkit

from accelkit import resources
from accelkit.cli import COMMANDS, main
from accelkit.errors import AccelkitError

HEAVY_MODULES = ("torch", "accelerate", "transformers", "datasets", "deepspeed", "libcst", "safetensors", "yaml")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    # Build from a clean copy of the sources: setuptools reuses a build/ folder, which could hide a missing file.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for name in ("accelkit", "templates", "accelerate_configs"):
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
                   check=True, capture_output=True, text=True)
    (whl,) = out.glob("accelkit-*.whl")
    return whl


def _data_files(folder: str) -> set[str]:
    root = REPO_ROOT / folder
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.mark.slow  # builds a wheel: about 10 s of CPU, kept out of the fast loop
def test_wheel_ships_templates_and_presets(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("templates", "accelerate_configs"):
        expected = _data_files(folder)
        assert expected, f"{folder}/ is empty"
        shipped = {n.removeprefix(f"accelkit/{folder}/") for n in names if n.startswith(f"accelkit/{folder}/")}
        assert expected <= shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "accelkit = accelkit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow  # builds and installs a wheel
def test_installed_wheel_finds_its_data(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    pip_install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
    subprocess.run([*pip_install, str(wheel)], check=True, capture_output=True)
    code = ("import json, accelkit.resources as r; "
            "print(json.dumps([str(r.templates_dir()), str(r.configs_dir())]))")
    proc = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(target)}, cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    templates, configs = map(Path, json.loads(proc.stdout))
    assert templates.is_relative_to(target) and configs.is_relative_to(target)
    assert {p.name for p in templates.iterdir()} >= {p.name for p in (REPO_ROOT / "templates").iterdir()
                                                     if p.is_dir() and p.name != "__pycache__"}
    presets = {p.name for p in (REPO_ROOT / "accelerate_configs").glob("*.yaml")}
    assert {p.name for p in configs.glob("*.yaml")} == presets


def test_checkout_reads_data_live() -> None:
    assert resources.templates_dir() == REPO_ROOT / "templates"
    assert resources.configs_dir() == REPO_ROOT / "accelerate_configs"


@pytest.mark.parametrize("args", [["--help"], *[[name, "--help"] for name in COMMANDS]], ids=lambda a: " ".join(a))
def test_help_never_imports_heavy_libraries(args: list[str]) -> None:
    code = (
        "import sys\n"
        "from accelkit.cli import cli\n"
        f"rv = cli.main(args={args!r}, prog_name='accelkit', standalone_mode=False)\n"
        f"print('imported:', [m for m in {HEAVY_MODULES!r} if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage:" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "imported: []"


def test_python_dash_m_and_version() -> None:
    proc = run_accelkit("--version", check=True)
    assert "accelkit, version" in proc.stdout


def test_unknown_command_is_a_usage_error() -> None:
    proc = run_accelkit("no-such-command")
    assert proc.returncode == 2
    assert "No such command" in proc.stderr and "Traceback" not in proc.stderr


def _raise_user_error() -> None:
    raise AccelkitError("the thing is wrong", hint="run `accelkit fix`")


def _raise_bug() -> None:
    raise RuntimeError("unexpected")


@pytest.fixture
def failing_command(monkeypatch):
    """Register a temporary command that raises, to exercise main()'s error handling."""
    import accelkit.cli as cli_module

    def install(func):
        command = click.Command("boom", callback=func)
        monkeypatch.setattr(cli_module.LazyGroup, "get_command",
                            lambda self, ctx, name: command if name == "boom" else None)
    return install


def test_user_error_prints_message_and_hint_without_traceback(failing_command, capsys, monkeypatch) -> None:
    monkeypatch.delenv("ACCELKIT_DEBUG", raising=False)
    failing_command(_raise_user_error)
    with pytest.raises(SystemExit) as exit_info:
        main(["boom"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("Error: the thing is wrong")
    assert "Hint: run `accelkit fix`" in err
    assert "Traceback" not in err


def test_debug_env_shows_the_traceback(failing_command, monkeypatch) -> None:
    monkeypatch.setenv("ACCELKIT_DEBUG", "1")
    failing_command(_raise_user_error)
    with pytest.raises(AccelkitError):
        main(["boom"])


def test_unexpected_exception_is_one_line_unless_debug(failing_command, capsys, monkeypatch) -> None:
    monkeypatch.delenv("ACCELKIT_DEBUG", raising=False)
    failing_command(_raise_bug)
    with pytest.raises(SystemExit) as exit_info:
        main(["boom"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert "RuntimeError: unexpected" in err and "ACCELKIT_DEBUG=1" in err
    monkeypatch.setenv("ACCELKIT_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["boom"])
