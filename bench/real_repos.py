"""Measure ampmigrate on whole real repositories: what it migrates, leaves, and breaks.

Each repository under ROOT (default /work/real, one folder per repository) is copied to a
temporary folder, migrated whole with ``python -m migrate COPY --write --output-format json``
(the ampmigrate checkout under test is put first on PYTHONPATH: ``--tool-path``), and then
measured file by file:

  apex       Python files that import Apex, or call amp.initialize / amp.scale_loss /
             amp.master_params, before the run
  full       of those: changed or not, no Apex left (no apex import, no amp API call) and no
             finding that needs a human
  partly     changed, but Apex left or a finding needing review
  findings   unchanged, with findings (or left out of the walk with a note saying why)
  silent     unchanged, no finding at all (Apex left without a word)
  failed     the tool reported the file as failed (unparsable, Python 2, ...)
  no-compile written files that do not compile (must be 0)
  undefined  written files where the migration made a name undefined (ruff F821/F823 on the
             output, for a name the original defined or took from a star import): a crash
             waiting at run time (must be 0; needs ruff, -1 without it)
  2nd-pass   files ``--check`` on the written copy would change again (must be 0)
  left:*     files that still import Apex after --write, by construct (amp, parallel,
             fp16_utils, optimizers, normalization, other)
  apex-free  Apex files whose Apex imports, run in their try/except guards with a fake
             ``apex`` package first on sys.path that raises ModuleNotFoundError, raise nothing

    python bench/real_repos.py [ROOT] [--tool-path CHECKOUT] [--jobs 2] [--json] [--only NAME]

The script never imports torch nor the tool: the tool runs in a subprocess.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

DEFAULT_ROOT = Path("/work/real")
SCRIPT_CHECKOUT = Path(__file__).resolve().parents[1]
# Folders never worth walking (the tool skips them too).
SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", "build", "dist", ".tox"}
AMP_CALL = re.compile(r"\bamp\s*\.\s*(initialize|scale_loss|master_params)\s*\(")
AMP_APIS = frozenset({"initialize", "scale_loss", "master_params"})
APEX_IMPORT_LINE = re.compile(r"^\s*(from\s+apex(\.\w+)*\s+import\b|import\s+apex\b)", re.M)
CONSTRUCTS = ("amp", "parallel", "fp16_utils", "optimizers", "normalization", "other")
TOOL_TIMEOUT_S = 900
TRY_TYPES: tuple[type[ast.stmt], ...] = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)


@dataclass
class RepoRow:
    """One repository's figures (file counts unless said otherwise)."""

    repo: str
    py_files: int = 0
    apex: int = 0
    full: int = 0
    partly: int = 0
    findings: int = 0
    silent: int = 0
    failed: int = 0
    no_compile: int = 0
    undefined: int = 0
    second_pass: int = 0
    apex_free: int = 0
    left: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CONSTRUCTS, 0))
    seconds: float = 0.0
    error: str = ""
    # Relative paths behind the figures, for whoever digs into a row.
    details: dict[str, list[str]] = field(default_factory=dict)

    def note(self, kind: str, path: str) -> None:
        self.details.setdefault(kind, []).append(path)


# -- reading Apex out of source --------------------------------------------------------


def _construct(module: str, names: list[str]) -> set[str]:
    """The Apex constructs one import statement brings in (``apex.amp`` -> amp, ...)."""
    parts = module.split(".")
    if parts[0] != "apex":
        return set()
    if len(parts) > 1:
        return {parts[1] if parts[1] in CONSTRUCTS else "other"}
    found = {name if name in CONSTRUCTS else "other" for name in names}
    return found or {"other"}


def _apex_imports(tree: ast.AST) -> list[tuple[ast.stmt, set[str]]]:
    """Every import statement of Apex in the tree, with the constructs it brings in."""
    found: list[tuple[ast.stmt, set[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                constructs = _construct(alias.name, [])
                if constructs:
                    found.append((node, constructs))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            constructs = _construct(node.module, [alias.name for alias in node.names])
            if constructs:
                found.append((node, constructs))
    return found


def apex_constructs(source: str) -> tuple[set[str], bool]:
    """(constructs imported, whether an amp API is called) of one file's source.

    Files that do not parse (Python 2) fall back to a line match of the imports.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        lines = APEX_IMPORT_LINE.findall(source)
        return ({"other"} if lines else set()), bool(AMP_CALL.search(source))
    calls = _calls_amp(tree)
    constructs: set[str] = set()
    for _, found in _apex_imports(tree):
        constructs |= found
    if not constructs and _binds_other_amp(tree):
        calls = False  # `import mxnet.contrib.amp as amp`: another library's amp.initialize
    return constructs, calls


def _calls_amp(tree: ast.AST) -> bool:
    """Whether code (not a comment or string) calls ``<...>amp.initialize/scale_loss/master_params``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in AMP_APIS:
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name == "amp":
                return True
    return False


def _binds_other_amp(tree: ast.AST) -> bool:
    """Whether an import binds the name ``amp`` to a module that is not Apex."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any((a.asname or a.name) == "amp" and not a.name.startswith("apex") for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("apex"):
            if any((a.asname or a.name) == "amp" for a in node.names):
                return True
    return False


# -- does the module import with Apex absent? ------------------------------------------

FAKE_APEX = "raise ModuleNotFoundError(\"No module named 'apex' (fake package of bench/real_repos.py)\")\n"

# Runs in a subprocess: reads skeleton programs (JSON list of [path, code]) on stdin and
# prints, as JSON, the paths whose skeleton raised.
SKELETON_RUNNER = textwrap.dedent("""
    import json, sys
    failures = {}
    for path, code in json.load(sys.stdin):
        try:
            exec(compile(code, path, "exec"), {"__name__": "skeleton"})
        except BaseException as error:  # noqa: BLE001 - any escape means "not apex-free"
            failures[path] = f"{type(error).__name__}: {error}"
    print(json.dumps(failures))
""")


class _Skeleton:
    """Keeps a module's Apex imports inside the try/except blocks that guard them.

    The result runs exactly those imports, with the guards' real ``except`` matching,
    wherever they are (module level, functions, methods, if-branches: all are assumed to
    run, which is the conservative choice). A handler body becomes ``pass``, or ``raise``
    where the original gives up.
    """

    def build(self, tree: ast.Module) -> str | None:
        body = self._statements(tree.body)
        if not body:
            return None
        return ast.unparse(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])))

    def _statements(self, statements: list[ast.stmt]) -> list[ast.stmt]:
        kept: list[ast.stmt] = []
        for statement in statements:
            kept.extend(self._statement(statement))
        return kept

    def _statement(self, node: ast.stmt) -> list[ast.stmt]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return [node] if _apex_imports(node) else []
        if isinstance(node, TRY_TYPES):
            node = cast(ast.Try, node)  # ast.TryStar has the same fields
            body = self._statements(node.body)
            inner = [*self._statements(node.orelse), *self._statements(node.finalbody)]
            for handler in node.handlers:
                inner.extend(self._statements(handler.body))
            if not body:
                return inner
            handlers = [
                ast.ExceptHandler(type=_builtin_type(handler.type), name=None, body=_handler_body(handler))
                for handler in node.handlers
            ]
            if not handlers:  # try/finally: nothing catches
                return [*body, *inner]
            return [ast.Try(body=body, handlers=handlers, orelse=[], finalbody=[]), *inner]
        kept: list[ast.stmt] = []
        for name in ("body", "orelse", "finalbody"):
            children = getattr(node, name, None)
            if isinstance(children, list) and children and isinstance(children[0], ast.stmt):
                kept.extend(self._statements(children))
        for handler in getattr(node, "handlers", []) or []:
            kept.extend(self._statements(handler.body))
        for case in getattr(node, "cases", []) or []:
            kept.extend(self._statements(case.body))
        return kept


def _handler_body(handler: ast.ExceptHandler) -> list[ast.stmt]:
    """``raise`` when the handler gives up at its top level (raise, exit()), else ``pass``.

    ``except ImportError: raise ImportError("install apex")`` still fails to import;
    a raise under a condition (``if args.fp16: raise``) depends on run time and is
    taken as not raising.
    """
    for statement in handler.body:
        gives_up = isinstance(statement, ast.Raise) or (
            isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Call)
            and ast.unparse(statement.value.func) in ("exit", "quit", "sys.exit", "os._exit")
        )
        if gives_up:
            return ast.parse("raise ImportError('the except clause of an apex import gives up')").body
    return [ast.Pass()]


def _builtin_type(node: ast.expr | None) -> ast.expr | None:
    """A handler's exception type, with names that are not builtins made to catch nothing.

    ``except (ImportError, MyError)`` keeps ImportError; ``except MyError`` alone would
    need the module's namespace, so it becomes a type that matches nothing.
    """
    if node is None:
        return None
    names = [node] if not isinstance(node, ast.Tuple) else list(node.elts)
    kept: list[ast.expr] = [n for n in names if isinstance(n, ast.Name) and hasattr(builtins, n.id)]
    if not kept:
        return ast.Name(id="StopAsyncIteration", ctx=ast.Load())  # matches no import error
    if len(kept) == 1:
        return kept[0]
    return ast.Tuple(elts=kept, ctx=ast.Load())


def apex_free(files: dict[str, str], fake_root: Path) -> dict[str, str]:
    """Which files raise when their Apex imports run with Apex absent: {path: error}."""
    skeletons = []
    for path, source in files.items():
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError) as error:
            skeletons.append([path, f"raise SyntaxError({str(error)!r})"])
            continue
        code = _Skeleton().build(tree)
        if code:
            skeletons.append([path, code])
    if not skeletons:
        return {}
    env = dict(os.environ, PYTHONPATH=str(fake_root))
    result = subprocess.run(
        [sys.executable, "-c", SKELETON_RUNNER],
        input=json.dumps(skeletons),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"skeleton runner failed: {result.stderr[-500:]}")
    failures: dict[str, str] = json.loads(result.stdout)
    return failures


# -- one repository --------------------------------------------------------------------


def _apex_checkout(folder: str, name: str) -> bool:
    """A vendored clone of NVIDIA/apex (openai/jukebox's ``apex/``): the library, not the
    project's code, and left out by the tool's discovery too."""
    inner = os.path.join(folder, name)
    return all(os.path.exists(os.path.join(inner, part)) for part in ("apex/__init__.py", "csrc", "setup.py"))


def python_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not _apex_checkout(folder, d))
        found.extend(Path(folder, name) for name in sorted(files) if name.endswith(".py"))
    return found


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


def run_tool(tool_path: Path, target: Path, *flags: str) -> dict[str, Any]:
    """``python -m migrate TARGET FLAGS --output-format json`` of the checkout under test."""
    env = dict(os.environ, PYTHONPATH=str(tool_path))
    command = [sys.executable, "-m", "migrate", str(target), *flags, "--output-format", "json", "--jobs", "1"]
    # run from the checkout: `python -m` puts the working folder first on sys.path, so from
    # another checkout it would measure that one
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=TOOL_TIMEOUT_S, cwd=tool_path.resolve()
    )
    if result.returncode not in (0, 1, 2) or not result.stdout.strip().startswith("{"):
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {result.returncode}: {' | '.join(tail)[:300]}")
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def measure(repo: Path, tool_path: Path, fake_root: Path) -> RepoRow:
    row = RepoRow(repo=repo.name.replace("__", "/", 1))
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="realrepo-") as scratch:
            copy = Path(scratch) / repo.name
            shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            _measure_copy(row, copy, tool_path, fake_root)
            _count_undefined(row, repo, copy)
    except Exception as error:
        row.error = f"{type(error).__name__}: {error}"[:400]
    row.seconds = round(time.perf_counter() - started, 1)
    return row


def _measure_copy(row: RepoRow, copy: Path, tool_path: Path, fake_root: Path) -> None:
    files = python_files(copy)
    row.py_files = len(files)
    before: dict[str, tuple[set[str], bool]] = {}
    for path in files:
        constructs, calls = apex_constructs(read(path))
        if constructs or calls:
            before[str(path.relative_to(copy))] = (constructs, calls)
    row.apex = len(before)

    report = run_tool(tool_path, copy, "--write")
    results = {str(Path(entry["path"]).resolve().relative_to(copy.resolve())): entry for entry in report["files"]}
    # files the walk left out with a word (a .gitignore pattern matching a tracked file that uses Apex)
    noticed = set()
    for notice in report.get("notices", []):
        shown = Path(notice.partition(": ")[0]).resolve()
        if shown.is_relative_to(copy.resolve()):
            noticed.add(str(shown.relative_to(copy.resolve())))

    for rel, entry in results.items():
        if entry.get("written") and rel.endswith(".py"):
            try:
                compile(read(copy / rel), rel, "exec")
            except (SyntaxError, ValueError):
                row.no_compile += 1
                row.note("no_compile", rel)

    after: dict[str, str] = {}
    for rel in before:
        source = read(copy / rel)
        after[rel] = source
        entry = results.get(rel)
        status = entry["status"] if entry else "not scanned"
        review = bool(entry and (entry["needs_review"] or any(not f.get("fixed") for f in entry["findings"])))
        constructs, calls = apex_constructs(source)
        for construct in constructs:
            row.left[construct] += 1
            row.note(f"left:{construct}", rel)
        apex_left = bool(constructs or calls)
        if status == "failed":
            row.failed += 1
            row.note("failed", rel)
        elif not apex_left and not review:
            row.full += 1
        elif status == "changed":
            row.partly += 1
            row.note("partly", rel)
        elif (entry and entry["findings"]) or rel in noticed:
            row.findings += 1
            row.note("findings", rel)
        else:
            row.silent += 1
            row.note("silent", rel)

    failures = apex_free(after, fake_root)
    row.apex_free = len(before) - len(failures)
    for rel, error in sorted(failures.items()):
        row.note("not_apex_free", f"{rel}: {error}")

    again = run_tool(tool_path, copy, "--check")
    for entry in again["files"]:
        if entry["status"] == "changed":
            row.second_pass += 1
            row.note("second_pass", str(Path(entry["path"]).resolve().relative_to(copy.resolve())))


_UNDEFINED_NAME = re.compile(r"`([^`]+)`")


def undefined_names(source: str) -> set[str] | None:
    """Names ruff finds undefined in ``source`` (F821/F823, and F405: maybe from a star import);
    None where ruff is not installed."""
    command = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F821,F823,F405"]
    command += ["--output-format", "json", "--stdin-filename", "file.py", "-"]
    try:
        result = subprocess.run(command, input=source, capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    if result.returncode not in (0, 1) or not result.stdout.startswith("["):
        return None
    names = set()
    for finding in json.loads(result.stdout):
        match = _UNDEFINED_NAME.search(finding["message"])
        if match:
            names.add(match.group(1))
    return names


def _count_undefined(row: RepoRow, original: Path, copy: Path) -> None:
    """Written files whose migration uses a name nothing defines any more."""
    for path in python_files(copy):
        rel = path.relative_to(copy)
        if not (original / rel).is_file():
            continue
        written, source = read(path), read(original / rel)
        if written == source:
            continue
        after, before = undefined_names(written), undefined_names(source)
        if after is None or before is None:
            row.undefined = -1
            return
        if after - before:
            row.undefined += 1
            row.note("undefined", f"{rel}: {', '.join(sorted(after - before))}")


# -- report ----------------------------------------------------------------------------

COLUMNS = [
    ("repo", "repository"),
    ("py_files", ".py"),
    ("apex", "apex"),
    ("full", "full"),
    ("partly", "partly"),
    ("findings", "findings"),
    ("silent", "silent"),
    ("failed", "failed"),
    ("no_compile", "no-compile"),
    ("undefined", "undefined"),
    ("second_pass", "2nd-pass"),
    ("apex_free", "apex-free"),
    *((f"left:{c}", f"left:{c}") for c in CONSTRUCTS),
    ("seconds", "s"),
]


def _cell(row: RepoRow, key: str) -> str:
    if key.startswith("left:"):
        return str(row.left[key[5:]])
    return str(getattr(row, key))


def markdown(rows: list[RepoRow]) -> str:
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "|".join("---" if key == "repo" else "---:" for key, _ in COLUMNS) + "|",
    ]
    for row in rows:
        if row.error:
            lines.append(f"| {row.repo} | {row.py_files} | {row.apex} | ERROR: {row.error} |")
            continue
        lines.append("| " + " | ".join(_cell(row, key) for key, _ in COLUMNS) + " |")
    total = totals(rows)
    lines.append("| **total** | " + " | ".join(str(total[key]) for key, _ in COLUMNS[1:]) + " |")
    share = 100.0 * total["full"] / total["apex"] if total["apex"] else 0.0
    lines.append("")
    lines.append(
        f"{len(rows)} repositories ({sum(1 for r in rows if r.error)} errors), {total['apex']} Apex files: "
        f"{total['full']} fully migrated ({share:.1f}%), {total['partly']} partly, {total['findings']} left with "
        f"findings, {total['silent']} left silently, {total['failed']} failed; {total['no_compile']} outputs do "
        f"not compile, {total['undefined']} gained an undefined name, {total['second_pass']} change on a second pass; {total['apex_free']} import with Apex absent."
    )
    return "\n".join(lines)


def totals(rows: list[RepoRow]) -> dict[str, Any]:
    total: dict[str, Any] = Counter()
    for row in rows:
        if row.error:
            continue
        for key, _ in COLUMNS[1:]:
            value = row.left[key[5:]] if key.startswith("left:") else getattr(row, key)
            total[key] += value
    total["seconds"] = round(total["seconds"], 1)
    return dict(total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", type=Path, default=DEFAULT_ROOT, help="folder of repositories")
    parser.add_argument("--tool-path", type=Path, default=SCRIPT_CHECKOUT, help="ampmigrate checkout to test")
    parser.add_argument("--jobs", type=int, default=2, help="repositories measured at once")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    parser.add_argument("--only", action="append", default=[], help="measure only repositories containing this")
    args = parser.parse_args(argv)

    repos = sorted(p for p in args.root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if args.only:
        repos = [p for p in repos if any(name.lower() in p.name.lower() for name in args.only)]
    if not (args.tool_path / "migrate" / "__main__.py").is_file():
        parser.error(f"{args.tool_path} is not an ampmigrate checkout (no migrate/__main__.py)")

    with tempfile.TemporaryDirectory(prefix="fake-apex-") as fake:
        fake_root = Path(fake)
        (fake_root / "apex").mkdir()
        (fake_root / "apex" / "__init__.py").write_text(FAKE_APEX)
        # Threads suffice: each repository's work is subprocesses.
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(lambda repo: measure(repo, args.tool_path.resolve(), fake_root), repos))

    commit = subprocess.run(
        ["git", "-C", str(args.tool_path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if args.json:
        document = {
            "tool_path": str(args.tool_path.resolve()),
            "tool_commit": commit,
            "totals": totals(rows),
            "repos": [asdict(row) for row in rows],
        }
        print(json.dumps(document, indent=2))
    else:
        print(f"ampmigrate at {args.tool_path.resolve()} ({commit or 'no git'}), repositories in {args.root}\n")
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
