"""``ampmigrate verify``: print the report (or its JSON), return the exit code."""

from __future__ import annotations

import json
from collections.abc import Sequence

from migrate.verify.session import EXIT_ERROR, compare


def run_cli(
    original: str,
    migrated: str,
    steps: int,
    device: str,
    script_args: Sequence[str],
    *,
    entry: str | None = None,
    json_output: bool = False,
    overflow: bool = True,
    overflow_at: Sequence[int] | None = None,
    seed: int = 0,
) -> int:
    """Entry point of ``ampmigrate verify``: print the report, return the exit code (0/1/2)."""
    try:
        result = compare(
            original,
            migrated,
            steps=steps,
            device=device,
            script_args=tuple(script_args),
            entry=entry,
            overflow=overflow,
            overflow_at=overflow_at,
            seed=seed,
        )
    except ValueError as error:
        message = f"ampmigrate verify: {error}"
        print(json.dumps({"verdict": "error", "exit_code": EXIT_ERROR, "summary": message}) if json_output else message)
        return EXIT_ERROR
    print(json.dumps(result.to_json(), indent=2) if json_output else result.report())
    return result.exit_code
