"""mindspeed_rl.algorithms and mindspeed_rl.rewards stay pure: no ray, megatron, torch.distributed or config.

Two checks: a fresh interpreter where those packages cannot be imported must still import (and
use) both packages; and a scan of every import statement in them, which also sees imports
hidden inside functions.
"""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PURE_PACKAGES = [REPO / "mindspeed_rl" / "algorithms", REPO / "mindspeed_rl" / "rewards"]
ALLOWED_THIRD_PARTY = {"torch", "numpy", "math_verify"}
ALLOWED_PROJECT = ("mindspeed_rl.algorithms", "mindspeed_rl.rewards", "mindspeed_rl.utils.errors")

CHILD = r"""
import importlib.abc, sys

import torch  # torch imports torch.distributed itself; forget it so that any import of ours is caught

for name in [n for n in sys.modules if n == "torch.distributed" or n.startswith("torch.distributed.")]:
    del sys.modules[name]


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in ("ray", "megatron", "hydra", "omegaconf") or name.startswith("torch.distributed") \
                or name.startswith("mindspeed_rl.config"):
            raise ImportError(f"{name} is blocked in this test")
        return None


sys.meta_path.insert(0, Blocker())

from mindspeed_rl.algorithms import compute_advantages, policy_loss
from mindspeed_rl.rewards import score_batch

mask = torch.ones(2, 3)
adv, _ = compute_advantages("grpo", torch.tensor([1.0, 0.0]), [0, 0], mask)
loss, _ = policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), adv, mask)
scores, _ = score_batch(["#### 72", "\\boxed{3}"], ["72", "3"], ["gsm8k", "math"])
assert scores == [1.0, 2.0], scores  # "\\boxed{3}" also ends with the number 3 (gsm8k)
print("pure")
"""


def test_imports_with_heavy_stack_unimportable():
    result = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0 and "pure" in result.stdout, result.stderr[-3000:]


def _imported_names(path: Path):
    """(line, dotted name) of every import in a file, including `from a import b` as a.b."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: stays inside the package
                continue
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def test_every_import_statement_is_allowed():
    offenders = []
    for package in PURE_PACKAGES:
        for path in sorted(package.rglob("*.py")):
            for line, name in _imported_names(path):
                top = name.split(".")[0]
                allowed = (
                    (top in sys.stdlib_module_names)
                    or (top in ALLOWED_THIRD_PARTY and not name.startswith("torch.distributed"))
                    or name.startswith(ALLOWED_PROJECT)
                    or name == "mindspeed_rl"
                )
                if not allowed:
                    offenders.append(f"{path.relative_to(REPO)}:{line} imports {name}")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "distributed":
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses torch.distributed")
    assert not offenders, "\n".join(offenders)
