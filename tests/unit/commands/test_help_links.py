"""Every `--help` ends with the path of its page in the manual, and that page exists and is in the site's nav."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from helpers import REPO_ROOT

from accelkit.cli import COMMANDS, DOCS_BASE, cli, docs_link


def _nav_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    items = nav.values() if isinstance(nav, dict) else nav
    return set().union(*(_nav_pages(item) for item in items))


def _last_line(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, prog_name="accelkit")
    assert result.exit_code == 0, result.output
    return result.output.rstrip().splitlines()[-1].strip()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_help_ends_with_its_docs_page(name: str) -> None:
    assert _last_line([name, "--help"]) == f"Docs: {DOCS_BASE}commands/{name}.md" == docs_link(name)
    assert _last_line([name, "--help"]).count("Docs:") == 1  # asking twice does not add the link twice


def test_group_help_ends_with_the_front_page() -> None:
    assert _last_line(["--help"]) == f"Docs: {DOCS_BASE}index.md"


def test_every_linked_page_exists_and_is_in_the_nav() -> None:
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())
    docs_dir = REPO_ROOT / config.get("docs_dir", "docs")
    assert f"{docs_dir.relative_to(REPO_ROOT).as_posix()}/" == DOCS_BASE
    nav = _nav_pages(config["nav"])
    for link in [docs_link(), *(docs_link(name) for name in COMMANDS)]:
        page = link.removeprefix(f"Docs: {DOCS_BASE}")
        assert (docs_dir / page).is_file(), page
        assert page in nav, page
