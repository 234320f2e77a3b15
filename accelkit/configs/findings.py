"""A finding about a config: what is wrong, how to fix it, and where (the config key and the command-line flag).

`accelkit config`, `accelkit launch` and `accelkit config --check` all report findings from the same rule set
(accelkit/configs/rules.py, and the file reader for what only a file can get wrong), so the same problem reads the
same everywhere: an error is printed `Error: <message>` / `  Hint: <hint>`, a warning `Warning: ...` / `  Hint: ...`.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.errors import AccelkitError

ERROR = "error"  # will fail, or silently do something other than what the config says
WARNING = "warning"  # works, probably not as meant


@dataclass(frozen=True)
class Finding:
    code: str  # stable name of the rule, e.g. "machine-rank-range" (tests and tools match on it, never on words)
    severity: str  # ERROR | WARNING
    message: str
    hint: str
    key: str = ""  # the Accelerate config key concerned (`fsdp_config.fsdp_version`), if any
    flag: str = ""  # the accelkit flag that sets it (`--fsdp-version`), if any
    # True when only `accelerate launch` reading the file is affected: `accelkit launch` writes its own config
    # (every key explicit, launcher-only settings passed as flags), so a launch does not repeat these warnings.
    accelerate_only: bool = False

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    @property
    def fix(self) -> str:  # the name findings used before they printed "Hint:" like every other message
        return self.hint

    def to_error(self) -> AccelkitError:
        return AccelkitError(self.message, hint=self.hint)

    def lines(self) -> str:
        """The two printed lines, as the CLI shows them."""
        label = "Error" if self.is_error else "Warning"
        return f"{label}: {self.message}\n  Hint: {self.hint}"


def raise_first_error(findings: list[Finding] | tuple[Finding, ...], prefix: str = "", more: str | None = "") -> None:
    """AccelkitError for the first error, if any; `more` (None: say nothing) follows the count of the others."""
    errors = [f for f in findings if f.is_error]
    if not errors:
        return
    suffix = f" (and {len(errors) - 1} more{more})" if len(errors) > 1 and more is not None else ""
    raise AccelkitError(f"{prefix}{errors[0].message}{suffix}", hint=errors[0].hint)
