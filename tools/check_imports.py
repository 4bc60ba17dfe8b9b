"""Package lanes: every import a package makes is declared in its pyproject.toml, and no package
imports another's private modules or names.

    python tools/check_imports.py [ROOT]          exit 1 listing every violation, 0 when clean

Rules, over every ``import`` statement (module level or inside functions) of packages/*/src and
packages/*/tests:
1. An imported distribution other than the package itself and the standard library is declared:
   code under src/ in ``dependencies`` or in an optional-dependency group other than ``test``
   (an optional import, e.g. latch-ops' torch references); tests/ also in the ``test`` group.
   ``[tool.latch] optional-imports`` names what a package uses only where it is installed,
   without installing it (latch-memory's torch test oracle). pytest and hypothesis are the test runner's (tools/check_isolation.sh installs them); modules
   that are files beside the tests (helpers, conftest siblings) or in examples/ are local.
2. Across packages, no module path with a component starting with ``_`` and no imported name
   starting with ``_``; where the imported package lists ``[tool.latch] public`` modules, only those
   (``latch_codegen_h100``: its top-level API, not ``runtime`` or ``builder``).
Cross-package tests in the repository's tests/ may reach anything their setup installs.
Needs only the standard library (Python >= 3.11 for tomllib).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    sys.exit("check_imports.py needs Python >= 3.11 (tomllib)")

# import name -> distribution, where they differ or the name is not obvious
DIST_OF = {"attr": "attrs", "yaml": "pyyaml", "markdown_it": "markdown-it-py"}
TEST_RUNNER = {"pytest", "hypothesis", "_pytest"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[\s\[<>=!~;@(]", req.strip(), maxsplit=1)[0])


class Package:
    def __init__(self, folder: Path):
        self.folder = folder
        proj = tomllib.loads((folder / "pyproject.toml").read_text())
        self.project = proj["project"]
        self.name = _norm(self.project["name"])
        self.module = self.name.replace("-", "_")
        self.deps = {_req_name(r) for r in self.project.get("dependencies", [])}
        extras = self.project.get("optional-dependencies", {})
        self.optional = {_req_name(r) for e, rs in extras.items() if e != "test" for r in rs}
        self.test = {_req_name(r) for r in extras.get("test", [])}
        tool = proj.get("tool", {}).get("latch", {})
        self.public = None if tool.get("public") is None else set(tool["public"])
        # imported only where installed, never installed for the package (e.g. a test oracle's torch)
        self.optional |= {_norm(n) for n in tool.get("optional-imports", [])}


def imports(path: Path):
    """(line, module, names) of every absolute import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, tuple(a.name for a in node.names)


def check(root: Path) -> list[str]:
    packages = {}
    for d in sorted((root / "packages").iterdir()):
        if (d / "pyproject.toml").exists():
            p = Package(d)
            packages[p.module] = p
    examples = {f.stem for f in (root / "examples").glob("*.py")} if (root / "examples").is_dir() else set()
    stdlib = set(sys.stdlib_module_names)
    problems = []
    for pkg in packages.values():
        for where in ("src", "tests"):
            base = pkg.folder / where
            if not base.is_dir():
                continue
            for f in sorted(base.rglob("*.py")):
                if any(part.endswith(".egg-info") or part == "build" for part in f.parts):
                    continue
                local = {g.stem for g in f.parent.glob("*.py")} | {g.name for g in f.parent.iterdir() if g.is_dir()}
                rel = f.relative_to(root)
                for line, module, names in imports(f):
                    top = module.split(".")[0]
                    if top == pkg.module or top in stdlib or top == "__future__":
                        continue
                    at = f"{rel}:{line}"
                    other = packages.get(top)
                    if other is not None:
                        problems += _private(at, pkg, other, module, names)
                    if where == "tests" and (top in TEST_RUNNER or top in local or top in examples):
                        continue
                    dist = other.name if other is not None else _norm(DIST_OF.get(top, top))
                    declared = pkg.deps | pkg.optional | (pkg.test if where == "tests" else set())
                    if dist not in declared:
                        groups = "dependencies or a non-test optional group" if where == "src" else \
                            "dependencies or an optional-dependency group (e.g. test)"
                        problems.append(f"{at}: imports {module} (distribution {dist}), which "
                                        f"{pkg.folder.name}/pyproject.toml does not declare; add {dist} to its {groups}")
    return problems


def _private(at: str, pkg: Package, other: Package, module: str, names: tuple[str, ...]) -> list[str]:
    out = []
    parts = module.split(".")
    if any(p.startswith("_") for p in parts[1:]):
        out.append(f"{at}: imports {module}, a private module of {other.name}; use its public API")
    elif other.public is not None and module not in other.public:
        out.append(f"{at}: imports {module}, which {other.name} does not make public ([tool.latch] public in its "
                   f"pyproject.toml: {', '.join(sorted(other.public))}); use its public API")
    for n in names:
        if n.startswith("_"):
            out.append(f"{at}: imports the private name {n} from {module} ({other.name}); use a public name")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_imports: {len(problems)} undeclared or private import(s)", file=sys.stderr)
        return 1
    print(f"check_imports: ok ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
