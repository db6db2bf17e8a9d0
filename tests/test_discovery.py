"""Discovery: the fast .gitignore matching finds what pathspec would, and streaming."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pathspec import GitIgnoreSpec

from migrate.config import build_config
from migrate.discovery import Candidate, compile_gitignore, discover, iter_discover

# Patterns of every shape compile_gitignore treats differently: names, suffixes, globs,
# anchored and nested paths, folder-only, `**`, escapes, spaces, negation.
GITIGNORES = {
    ".gitignore": "# comment\n\n__pycache__/\n*.pyc\ndata\nscratch_*.py\n/top_only.py\nnested/deep/\n**/gen/*.py\n",
    "pkg/.gitignore": "*_pb2.py\nbuild*/\n\\#odd.py\nspaced.py \nlogs/*.py\n/anchored\nsub/lit.py\nout/dir/\n",
    "neg/.gitignore": "*.py\n!keep.py\n",
    "q/.gitignore": "file?.py\n[ab].py\n",
}
FILES = [
    "a.py",
    "top_only.py",
    "sub/top_only.py",
    "data/x.py",
    "sub/data",
    "sub/data.py",
    "scratch_1.py",
    "sub/scratch_2.py",
    "nested/deep/x.py",
    "nested/shallow/x.py",
    "x/nested/deep/y.py",
    "gen/a.py",
    "src/gen/b.py",
    "src/gen/sub/c.py",
    "pkg/m_pb2.py",
    "pkg/build_tmp/y.py",
    "pkg/buildish.py",
    "pkg/#odd.py",
    "pkg/spaced.py",
    "pkg/logs/l.py",
    "pkg/logs/more/l.py",
    "pkg/anchored/a.py",
    "pkg/anchored.py",
    "pkg/x/anchored/a.py",
    "pkg/sub/lit.py",
    "pkg/sub/lit.py.bak.py",
    "pkg/y/sub/lit.py",
    "pkg/out/dir/a.py",
    "pkg/out/dir.py",
    "neg/skip.py",
    "neg/keep.py",
    "neg/inner/keep.py",
    "q/file1.py",
    "q/file12.py",
    "q/a.py",
    "q/c.py",
    "nb.ipynb",
    "sub/__pycache__/c.py",
]


def reference(root: Path) -> set[str]:
    """What git would keep: each file against every .gitignore above it, by pathspec, whole paths."""
    kept = set()
    for name in FILES:
        if not name.endswith((".py", ".ipynb")):
            continue
        parts = name.split("/")
        ignored = False
        for depth in range(len(parts)):
            gitignore = root.joinpath(*parts[:depth], ".gitignore")
            if gitignore.exists():
                spec = GitIgnoreSpec.from_lines(gitignore.read_text().splitlines())
                ignored = spec.match_file("/".join(parts[depth:])) or ignored
                # a folder ignored on the way hides everything under it
                for end in range(depth + 1, len(parts)):
                    ignored = ignored or spec.match_file("/".join(parts[depth:end]) + "/")
        if not ignored:
            kept.add(name)
    return kept


def test_gitignore_matching_agrees_with_pathspec(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    for name, text in GITIGNORES.items():
        (tmp_path / name).write_text(text)
    config = build_config([tmp_path], exclude=())
    found = {os.path.relpath(candidate.path, tmp_path) for candidate in discover([tmp_path], config)[0]}
    assert found == reference(tmp_path)
    assert "a.py" in found and "neg/keep.py" in found and "q/c.py" in found  # the test is not vacuous
    assert "data/x.py" not in found and "src/gen/b.py" not in found and "pkg/#odd.py" not in found
    assert "pkg/anchored/a.py" not in found and "pkg/x/anchored/a.py" in found
    assert "pkg/sub/lit.py" not in found and "pkg/y/sub/lit.py" in found and "pkg/out/dir.py" in found


def test_a_folder_ignored_from_above_yields_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("vendored\n")
    (tmp_path / "vendored/lib").mkdir(parents=True)
    (tmp_path / "vendored/lib/m.py").write_text("x = 1\n")
    config = build_config([tmp_path / "vendored/lib"])
    assert discover([tmp_path / "vendored/lib"], config)[0] == []
    assert discover([tmp_path / "vendored/lib"], build_config([tmp_path], respect_gitignore=False))[0] != []


def test_discovery_streams_before_the_walk_is_over(tmp_path: Path) -> None:
    for index in range(3):
        (tmp_path / f"d{index}").mkdir()
        (tmp_path / f"d{index}/m.py").write_text("x = 1\n")
    stream = iter_discover([tmp_path], build_config([tmp_path]))
    first = next(stream)
    assert isinstance(first, Candidate)  # handed over while two folders are still unread
    assert len([first, *stream]) == 3


def test_a_file_given_twice_and_by_a_link_is_found_once(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src/m.py").write_text("x = 1\n")
    (tmp_path / "alias.py").symlink_to(tmp_path / "src/m.py")
    paths = [tmp_path / "src", tmp_path / "src/m.py", tmp_path / "alias.py", tmp_path]
    candidates, errors = discover(paths, build_config(paths))
    assert len(candidates) == 1 and errors == []


# Negations, where order and pathspec's folder-versus-file priority decide.
ORDERED = [
    "*.py\n!keep.py\n",
    "build/\n!build/keep.py\n",
    "!keep.py\n*.py\n",
    "logs/\n!logs/*.py\nlogs/deep/\n",
    "/data/**\n!/data/**/\n!/data/**/*.py\n",
    "*\n!*/\n!*.py\nsecret.py\n",
    "docs/*\n!docs/conf.py\n",
]
PROBES = [
    ("keep.py", False),
    ("skip.py", False),
    ("sub/keep.py", False),
    ("build", True),
    ("build/keep.py", False),
    ("build/other.py", False),
    ("logs", True),
    ("logs/a.py", False),
    ("logs/deep", True),
    ("logs/deep/a.py", False),
    ("data", True),
    ("data/x", True),
    ("data/x/y.py", False),
    ("secret.py", False),
    ("sub/secret.py", False),
    ("docs/conf.py", False),
    ("docs/other.py", False),
    ("docs/sub", True),
]


@pytest.mark.parametrize("text", ORDERED)
def test_ordered_patterns_agree_with_pathspec(text: str) -> None:
    lines = text.splitlines()
    spec = GitIgnoreSpec.from_lines(lines)
    matcher = compile_gitignore(lines)
    expected = [spec.match_file(path + "/" if is_dir else path) for path, is_dir in PROBES]
    assert [matcher(path, is_dir) for path, is_dir in PROBES] == expected
    assert any(expected) and not all(expected)  # the probes tell patterns apart


class _Memo:
    def __init__(self) -> None:
        self.known: dict[str, object] = {}

    def get(self, lines: str) -> object:
        return self.known.get(lines)

    def put(self, lines: str, translation: list[object]) -> None:
        self.known[lines] = translation


@pytest.mark.parametrize("text", [*ORDERED, GITIGNORES[".gitignore"], GITIGNORES["pkg/.gitignore"]])
def test_remembered_translations_give_the_same_answers(text: str) -> None:
    lines = text.splitlines()
    memo = _Memo()
    fresh = compile_gitignore(lines, memo)
    assert memo.known  # something was translated and remembered
    remembered = compile_gitignore(lines, memo)
    assert [remembered(path, is_dir) for path, is_dir in PROBES] == [fresh(path, is_dir) for path, is_dir in PROBES]


def test_a_warm_walk_does_not_import_pathspec(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    for name, text in GITIGNORES.items():
        (tmp_path / name).write_text(text)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from migrate.cache import Cache\n"
        "from migrate.config import build_config\n"
        "from migrate.discovery import discover\n"
        "root = Path(sys.argv[1])\n"
        "config = build_config([root], exclude=())\n"
        "translations = Cache(Path(sys.argv[2]), config.options).translations()\n"
        "found = sorted(candidate.display for candidate in discover([root], config, translations)[0])\n"
        "translations.save()\n"
        "print('pathspec' in sys.modules, found)\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path), str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(" ", 1)
        for _ in range(2)
    ]
    assert runs[0][0] == "True" and runs[1][0] == "False"  # translated once, then read back
    assert runs[0][1] == runs[1][1] and "neg/keep.py" in runs[1][1]


def test_a_vendored_apex_checkout_is_left_out_with_a_notice(tmp_path: Path) -> None:
    """openai/jukebox keeps a clone of NVIDIA/apex in ``apex/``: Apex's own package, tests and
    examples are the library, not the project, and are not migrated; the project's code is. Run
    on the checkout itself, the files are taken as usual."""
    from migrate.discovery import APEX_CHECKOUT
    from migrate.records import Notice

    for name in ("apex/apex/__init__.py", "apex/apex/parallel/__init__.py", "apex/tests/test_x.py", "app/train.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("from apex import amp\n")
    (tmp_path / "apex" / "setup.py").write_text("from setuptools import setup\n")
    (tmp_path / "apex" / "csrc").mkdir()
    (tmp_path / "lib" / "apex").mkdir(parents=True)  # a package named apex without Apex's build: taken
    (tmp_path / "lib" / "apex" / "__init__.py").write_text("from apex import amp\n")
    found = list(iter_discover([tmp_path], build_config([tmp_path])))
    taken = sorted(item.display.rpartition(tmp_path.name + "/")[2] for item in found if isinstance(item, Candidate))
    assert taken == ["app/train.py", "lib/apex/__init__.py"]
    notices = [item for item in found if isinstance(item, Notice)]
    assert [notice.message for notice in notices] == [APEX_CHECKOUT]
    assert notices[0].display.endswith("apex")
    on_itself = list(iter_discover([tmp_path / "apex"], build_config([tmp_path / "apex"])))
    assert sum(isinstance(item, Candidate) for item in on_itself) == 4


def test_an_ignored_file_that_uses_apex_gets_a_notice(tmp_path: Path) -> None:
    """tianweiy/CenterPoint's .gitignore has `**dist**` (meant for dist/), which also matches the
    tracked tools/dist_test.py, where Apex's convert_syncbn_model runs: the walk skips the file
    as git would skip an untracked one, and says so, rather than leave Apex without a word. An
    ignored file without Apex, and an ignored folder, stay silent."""
    from migrate.discovery import IGNORED_APEX_FILE
    from migrate.records import Notice

    (tmp_path / ".gitignore").write_text("**dist**\nbuild/\n")
    files = {
        "tools/dist_test.py": "import apex\nmodel = apex.parallel.convert_syncbn_model(model)\n",
        "tools/dist_utils.py": "import torch\n",
        "build/lib/train.py": "from apex import amp\n",
        "tools/train.py": "from apex import amp\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = list(iter_discover([tmp_path], build_config([tmp_path])))
    taken = [item.display.rpartition(tmp_path.name + "/")[2] for item in found if isinstance(item, Candidate)]
    assert taken == ["tools/train.py"]
    notices = [item for item in found if isinstance(item, Notice)]
    assert [(notice.display.rpartition(tmp_path.name + "/")[2], notice.message) for notice in notices] == [
        ("tools/dist_test.py", IGNORED_APEX_FILE)
    ]
    unignored = build_config([tmp_path], respect_gitignore=False)
    assert not [item for item in iter_discover([tmp_path], unignored) if isinstance(item, Notice)]
