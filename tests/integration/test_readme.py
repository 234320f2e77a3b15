"""The README's two set-up commands: the workflow one runs for real (after its install step), the test one is CI's."""

from __future__ import annotations

import re
import shlex

from helpers import REPO_ROOT, run_accelkit
from safetensors import safe_open


def setup_blocks() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def commands(block: str) -> list[list[str]]:
    joined = block.replace("\\\n", " ")
    return [shlex.split(part) for part in re.split(r"&&", joined) if part.strip()]


def test_readme_has_exactly_two_setup_commands() -> None:
    workflow, tests = setup_blocks()
    assert any(cmd[:2] == ["pip", "install"] for cmd in commands(workflow))
    assert ["python", "-m", "pytest", "-q"] in commands(tests)
    assert "python -m pytest -q" in (REPO_ROOT / ".ci" / "run").read_text()


def test_readme_workflow_runs_on_cpu(tmp_path) -> None:
    workflow, _ = setup_blocks()
    accelkit_steps = [cmd[1:] for cmd in commands(workflow) if cmd[0] == "accelkit"]
    assert [step[0] for step in accelkit_steps] == ["init", "launch", "merge-ckpt"]
    for step in accelkit_steps:
        run_accelkit(*step, cwd=tmp_path, timeout=600, check=True)
    merged = tmp_path / accelkit_steps[-1][accelkit_steps[-1].index("-o") + 1]
    with safe_open(str(merged), framework="pt") as f:
        names = list(f.keys())
        assert names and all(f.get_tensor(name).numel() > 0 for name in names)
    assert not list(tmp_path.rglob("*.tmp*")), "a temporary file was left behind"
