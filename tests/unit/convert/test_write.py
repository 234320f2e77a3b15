"""accelkit.convert.write_conversion: beside the script, to a path, or in place with a backup; every refusal comes
before the first byte is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.commands import convert as convert_command
from accelkit.convert.write import BACKUP_SUFFIX, read_script, write_conversion
from accelkit.errors import AccelkitError


def test_beside_the_script_to_a_path_and_in_place(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("old\n")
    assert write_conversion(script, "old\n", "new\n").path == tmp_path / "train_accelerate.py"
    assert (tmp_path / "train_accelerate.py").read_text() == "new\n"
    assert write_conversion(script, "old\n", "new\n", output=tmp_path / "out.py").path == tmp_path / "out.py"
    written = write_conversion(script, "old\n", "new\n", in_place=True)
    assert written.backup == tmp_path / f"train.py{BACKUP_SUFFIX}"
    assert read_script(script) == "new\n" and read_script(written.backup) == "old\n"


def test_refusals_write_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("old\n")
    (tmp_path / f"train.py{BACKUP_SUFFIX}").write_text("earlier backup\n")
    with pytest.raises(AccelkitError, match="already exists"):
        write_conversion(script, "old\n", "new\n", in_place=True)
    with pytest.raises(AccelkitError, match="would overwrite the input script"):
        write_conversion(script, "old\n", "new\n", output=script, force=True)
    assert script.read_text() == "old\n"
    assert (tmp_path / f"train.py{BACKUP_SUFFIX}").read_text() == "earlier backup\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", f"train.py{BACKUP_SUFFIX}"]
    script.write_bytes(b"\xff\xfe")
    with pytest.raises(AccelkitError, match="is not UTF-8 text"):
        read_script(script)


def test_the_help_names_the_backup_written() -> None:
    """`convert --help` keeps the suffix literal (it imports no convert module at load): it must be the one written."""
    assert convert_command.BACKUP_SUFFIX == BACKUP_SUFFIX
    in_place = next(p for p in convert_command.command.params if p.name == "in_place")
    assert f"SCRIPT{BACKUP_SUFFIX}" in in_place.help
