"""bench/real_repos.py: how it reads Apex out of source and decides "imports with Apex absent"."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_repos", ROOT / "bench" / "real_repos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_repos"] = module
    spec.loader.exec_module(module)
    return module


real_repos = _load()


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake")
    (root / "apex").mkdir()
    (root / "apex" / "__init__.py").write_text(real_repos.FAKE_APEX)
    return root


@pytest.mark.parametrize(
    ("source", "constructs", "calls"),
    [
        ("from apex import amp, optimizers\n", {"amp", "optimizers"}, False),
        ("import apex.normalization\nimport apex\n", {"normalization", "other"}, False),
        ("from apex.parallel import DistributedDataParallel as DDP\n", {"parallel"}, False),
        ("with self.amp.scale_loss(loss, opt) as s:\n    s.backward()\n", set(), True),
        ("print 'python 2'\nfrom apex.fp16_utils import FP16_Optimizer\n", {"other"}, False),
        ("import torch\nscaler = torch.amp.GradScaler('cuda')\n", set(), False),
        ("import mxnet.contrib.amp as amp\namp.init()\namp.initialize(trainer)\n", set(), False),
        ("from mxnet.contrib import amp\nnet = amp.initialize(net)\n", set(), False),
        ("# clip_grad_norm_(apex.amp.master_params(opt), 1.0)\nx = 'amp.scale_loss(l, o)'\n", set(), False),
        ("apex.amp.initialize(model, opt)\n", set(), True),
    ],
)
def test_apex_constructs(source: str, constructs: set[str], calls: bool) -> None:
    assert real_repos.apex_constructs(source) == (constructs, calls)


GUARDED = {
    "import_error": "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n",
    "module_not_found": "try:\n    import apex\nexcept ModuleNotFoundError:\n    pass\n",
    "bare": "try:\n    from apex.parallel import DDP\nexcept:\n    DDP = None\n",
    "tuple_in_function": "def f():\n    try:\n        from apex import amp\n    except (ImportError, KeyError):\n        return\n",
    "conditional_raise": "try:\n    from apex import amp\nexcept ImportError:\n    if fp16:\n        raise\n",
    "no_apex": "import os\n",
}
UNGUARDED = {
    "top_level": "import torch\nfrom apex.optimizers import FusedAdam\n",
    "in_function_branch": "def f():\n    if x:\n        from apex import amp\n",
    "wrong_exception": "try:\n    from apex import amp\nexcept AttributeError:\n    pass\n",
    "project_exception": "try:\n    from apex import amp\nexcept MyError:\n    pass\n",
    "reraises": "try:\n    from apex import amp\nexcept ImportError:\n    raise ImportError('install apex')\n",
    "exits": "import sys\ntry:\n    from apex import amp\nexcept ImportError:\n    print('no apex')\n    sys.exit(1)\n",
}


def test_apex_free_runs_the_guards(fake_root: Path) -> None:
    failures = real_repos.apex_free({**GUARDED, **UNGUARDED}, fake_root)
    assert set(failures) == set(UNGUARDED)


def test_undefined_counts_names_the_migration_lost(tmp_path: Path) -> None:
    """A written file that uses a name its original defined counts; one undefined before (or
    maybe from a star import) does not, nor does an unchanged file."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    sources = {
        "lost.py": (
            "def f(x):\n    if x:\n        from apex import amp\n        amp.scale_loss(x)\n",
            "def f(x):\n    if x:\n        amp.scale_loss(x)\n",
        ),
        "was_undefined.py": ("math.sqrt(2)\n", "math.sqrt(2)\nx = 1\n"),
        "star.py": ("from apex.fp16_utils import *\nmath.sqrt(2)\n", "math.sqrt(2)\n"),
        "same.py": ("y = z\n", None),
    }
    for name, (before, after) in sources.items():
        for root, text in ((original, before), (copy, before if after is None else after)):
            root.mkdir(exist_ok=True)
            (root / name).write_text(text)
    row = real_repos.RepoRow(repo="r")
    real_repos._count_undefined(row, original, copy)
    if row.undefined == -1:
        pytest.skip("ruff is not installed")
    assert row.undefined == 1
    assert row.details["undefined"] == ["lost.py: amp"]
