"""The ``ampmigrate`` command line: a thin click layer over config, runner and report.

``ampmigrate PATH...`` is the default command (migrate); ``ampmigrate verify`` runs an
original and a migrated training script side by side. Exit codes: 0 nothing left to
do, 1 ``--check`` found work, 2 usage error or a file could not be read or parsed, 130
interrupted by Ctrl-C (after reporting what was done).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from migrate import __version__
from migrate.config import ConfigError, OutputFormat, build_config
from migrate.entry import run_and_exit

DEFAULT_COMMAND = "migrate"


class DefaultGroup(click.Group):
    """A group whose first argument, unless it names a subcommand, goes to ``migrate``.

    So ``ampmigrate src/ --check`` and ``ampmigrate verify a.py b.py`` both work; a
    folder literally named ``verify`` is given as ``./verify``; any other name, ``migrate``
    included, is a path.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # The default command itself is hidden and never named on the command line,
        # so a folder called "migrate" is a path like any other.
        visible = {name for name, command in self.commands.items() if not command.hidden}
        if args and args[0] not in visible and args[0] not in ("--help", "-h", "--version"):
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] PATH...")
        formatter.write_usage(
            ctx.command_path,
            "verify [OPTIONS] ORIGINAL MIGRATED [-- SCRIPT_ARGS...]",
            prefix="       ",
        )

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The default command's options are the ones people need: show them here.
        migrate_command = self.commands[DEFAULT_COMMAND]
        sub_ctx = click.Context(migrate_command, info_name=ctx.info_name, **CONTEXT)  # type: ignore[arg-type]
        params = [
            *migrate_command.get_params(sub_ctx),
            *(p for p in self.params if p.name == "version"),
        ]
        records = [record for param in params if (record := param.get_help_record(sub_ctx))]
        with formatter.section("Options"):
            formatter.write_dl(records)
        self.format_commands(ctx, formatter)


CONTEXT: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
}


@click.group("ampmigrate", cls=DefaultGroup, context_settings=CONTEXT, no_args_is_help=True)
@click.version_option(__version__, "--version", prog_name="ampmigrate")
def main() -> None:
    """Migrate NVIDIA Apex mixed precision (apex.amp) to native torch.amp.

    With no subcommand, PATH... (files and folders, searched for *.py and *.ipynb)
    are migrated: by default a unified diff of what would change is printed and
    nothing is written. Add --write to rewrite the files, or --check to fail (exit 1)
    when something would change or needs manual review.

    The PATHs are one project: an Apex amp setup that spans modules (initialize in one,
    the training loop in another) is migrated whole, the GradScaler passed where it is
    needed, or left exactly as it was with a finding (AMP025) that says why.

    `ampmigrate verify ORIGINAL MIGRATED` runs a few training steps of a script before
    and after migration and compares the two (needs torch).

    Exit codes: 0 nothing left to do, 1 --check found work, 2 usage error or a file
    could not be read or parsed, 130 interrupted (Ctrl-C).
    """


@main.command(DEFAULT_COMMAND, context_settings=CONTEXT, hidden=True)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--diff",
    "diff",
    flag_value=True,
    default=None,
    help="Print a unified diff of the changes (the default).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 if a file would change or needs review.",
)
@click.option("--write", is_flag=True, help="Rewrite the files in place (atomically).")
@click.option(
    "--output-format",
    type=click.Choice([fmt.value for fmt in OutputFormat]),
    default=OutputFormat.TEXT.value,
    show_default=True,
    help="text: diffs and findings; json; github: workflow annotations; sarif: SARIF 2.1.0.",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a Markdown summary for a pull request to this file.",
)
@click.option(
    "-j",
    "--jobs",
    type=int,
    default=None,
    help="Parallel processes (default: all cores).",
)
@click.option(
    "--color/--no-color",
    default=None,
    help="Colour the diff (default: when stdout is a terminal).",
)
@click.option(
    "--device",
    default=None,
    help="Device type of the generated torch.autocast / GradScaler [default: cuda].",
)
@click.option(
    "--dtype",
    default=None,
    help="Autocast dtype: float16 or bfloat16 [default: float16].",
)
@click.option(
    "--scaler-name",
    default=None,
    help="Variable name of the generated GradScaler [default: scaler].",
)
@click.option("--select", default=None, help="Comma-separated rule names to run (default: all).")
@click.option(
    "--fused/--no-fused",
    default=None,
    help="Write fused=True into the torch Adam/AdamW replacing FusedAdam (torch >= 2.4 on the CPU) [default: fused].",
)
@click.option(
    "--exclude",
    multiple=True,
    help="Gitignore-style pattern to skip, replacing the default excludes (repeatable).",
)
@click.option(
    "--extend-exclude",
    multiple=True,
    help="Gitignore-style pattern to skip, in addition to the excludes (repeatable).",
)
@click.option(
    "--respect-gitignore/--no-respect-gitignore",
    default=None,
    help="Skip files .gitignore ignores [default: respect].",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Neither read nor write the result cache (in $AMPMIGRATE_CACHE_DIR, else $XDG_CACHE_HOME/ampmigrate, "
    "else the user cache folder).",
)
def migrate_command(
    paths: tuple[Path, ...],
    diff: bool | None,
    check: bool,
    write: bool,
    output_format: str,
    report_path: Path | None,
    jobs: int | None,
    color: bool | None,
    device: str | None,
    dtype: str | None,
    scaler_name: str | None,
    select: str | None,
    fused: bool | None,
    exclude: tuple[str, ...],
    extend_exclude: tuple[str, ...],
    respect_gitignore: bool | None,
    no_cache: bool,
) -> None:
    """Migrate PATH... (files and folders) from Apex amp to torch.amp."""
    try:
        config = build_config(
            list(paths),
            write=write,
            check=check,
            diff=diff,
            output_format=OutputFormat(output_format),
            jobs=jobs,
            # https://no-color.org: a set NO_COLOR turns colour off unless --color asks.
            color=False if color is None and os.environ.get("NO_COLOR") else color,
            report_path=report_path,
            device=device,
            dtype=dtype,
            scaler_name=scaler_name,
            select=(
                frozenset(name.strip() for name in select.split(",") if name.strip()) if select is not None else None
            ),
            exclude=exclude or None,
            extend_exclude=extend_exclude,
            respect_gitignore=respect_gitignore,
            fused=fused,
            cache=not no_cache,
        )
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    if config.options.select is not None:
        _check_rule_names(config.options.select)
    run_and_exit(list(paths), config, click.echo)


def _check_rule_names(selected: frozenset[str]) -> None:
    """Unknown names in --select / select would silently run nothing: refuse them."""
    from migrate.rules import RULE_NAMES  # imports libcst: only when selecting

    unknown = sorted(selected - set(RULE_NAMES))
    if unknown:
        raise click.UsageError(f"unknown rule(s) {', '.join(unknown)}; known: {', '.join(RULE_NAMES)}")


class BarTicks:
    """An iterator advancing a click progress bar; closes the bar at the last tick."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.bar: Any = click.progressbar(length=total, label="ampmigrate", file=sys.stderr)
        self.bar.__enter__()

    def __iter__(self) -> BarTicks:
        return self

    def __next__(self) -> None:
        self.bar.update(1)
        self.done += 1
        if self.done >= self.total:
            self.bar.__exit__(None, None, None)


@main.command("verify", context_settings=CONTEXT)
@click.argument("original", type=click.Path(exists=True))
@click.argument("migrated", type=click.Path(exists=True))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Optimizer steps to compare.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="Where to run both scripts (auto: cuda when available).",
)
@click.option(
    "--entry",
    metavar="SCRIPT",
    help="With two project folders: the script to run in each (a path inside the folder).",
)
@click.option(
    "--overflow/--no-overflow",
    default=True,
    show_default=True,
    help="Plant overflows in both runs and shorten the scalers' growth window, to compare skips, back-off and growth.",
)
@click.option(
    "--overflow-at",
    metavar="STEPS",
    help="Comma-separated steps to plant the overflows at (default: 1, 4, 11, then every 15th).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for torch, random and numpy in both runs.")
@click.option("--json", "json_output", is_flag=True, help="Print the result as JSON (for CI).")
def verify_command(
    original: str,
    migrated: str,
    script_args: Sequence[str],
    steps: int,
    device: str,
    entry: str | None,
    overflow: bool,
    overflow_at: str | None,
    seed: int,
    json_output: bool,
) -> None:
    """Run ORIGINAL (under the Apex shim) and MIGRATED for a few steps and compare them.

    ORIGINAL and MIGRATED are two scripts, or two project folders run through the same
    --entry script. Arguments after `--` are passed to both scripts, which run with your
    permissions (they are executed, like `python SCRIPT`). Exit 0: the migration trains like
    the original; 1: it diverges; 2: a script failed. Needs torch.
    """
    import importlib.util

    # Checked here, before anything runs: without torch both scripts would only fail
    # to import it, and that would read like two broken scripts.
    if importlib.util.find_spec("torch") is None:
        raise click.UsageError(
            "`ampmigrate verify` needs torch, which is not installed in this environment "
            f"({sys.executable}). Install it with: pip install 'ampmigrate[torch]' (or pip install torch)"
        )
    try:
        at = [int(step) for step in overflow_at.split(",") if step.strip()] if overflow_at else None
    except ValueError:
        raise click.BadParameter("a comma-separated list of step numbers", param_hint="--overflow-at") from None
    try:
        from migrate.verify import run_cli  # torch is imported only by the runs it starts
    except ImportError as error:
        raise click.UsageError(f"`ampmigrate verify` needs torch: {error}") from None
    sys.exit(
        run_cli(
            original,
            migrated,
            steps,
            device,
            tuple(script_args),
            entry=entry,
            json_output=json_output,
            overflow=overflow,
            overflow_at=at,
            seed=seed,
        )
    )
