#!/usr/bin/env bash
# Each package installs ALONE (with only what its pyproject.toml declares) in a fresh venv, and its
# own tests pass there. What a package's tests need beyond its runtime dependencies goes in an
# optional-dependency group named "test" (e.g. test = ["latch-schedule", "latch-memory"]), which is
# installed here too. latch-core, latch-schedule and latch-memory get no torch at all: the venvs
# are created without --system-site-packages, and the script checks `import torch` fails in them.
#
# First, tools/check_imports.py: every import a package's code and tests make is declared in its
# pyproject.toml, and no package imports another's private modules or names (fails listing each).
#
# Usage: bash tools/check_isolation.sh [PACKAGE ...]     (default: every packages/*)
# Environment: PYTHON                 interpreter for the venvs (default: python3)
#              LATCH_ISOLATION_CACHE  reusable cache of wheels and of one torch install
#                                     (default: ~/.cache/latch/isolation)
#              LATCH_ISOLATION_PYTEST pytest selection (default: -m "not gpu and not slow": slow tests
#                                     run in the main CI job; here we check packaging and imports)
#
# How it stays fast (a few minutes on 2 cores):
# - the Latch packages are built into wheels once per run, then installed from those files;
# - third-party wheels are kept in the cache and offered with --find-links;
# - torch (~900 MB installed) is installed once into the cache with `pip install --target`, and a
#   .pth file puts it on the path of the venvs whose package declares torch (as a dependency or an
#   extra). pip sees it as installed, so a torch requirement is satisfied without a copy.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
CACHE="${LATCH_ISOLATION_CACHE:-$HOME/.cache/latch/isolation}"
TORCH_PIN="torch==2.13.0"
read -r -a PYTEST_SEL <<< "${LATCH_ISOLATION_PYTEST:--m not__gpu__and__not__slow}"
PYTEST_SEL=("${PYTEST_SEL[@]//__/ }")
WORK="$(mktemp -d "${TMPDIR:-/tmp}/latch-isolation.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

PYVER="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
TORCH_SITE="$CACHE/torch-site-$PYVER-${TORCH_PIN#torch==}"
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"

if [ "$#" -gt 0 ]; then
    PACKAGES=("$@")
else
    PACKAGES=()
    for d in "$ROOT"/packages/*/; do PACKAGES+=("$(basename "$d")"); done
fi

log() { printf '[isolation %4ds] %s\n' "$SECONDS" "$*"; }

log "package lanes: tools/check_imports.py"
"$PYTHON" "$ROOT/tools/check_imports.py" "$ROOT" || { echo "isolation: undeclared or private imports (above)" >&2; exit 1; }
# pip warns once per package about index locations of this machine's global pip configuration that
# do not exist; the noise hides real messages in CI logs. Everything else pip says passes through.
quiet_pip() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }

# --- one builder venv: builds the Latch wheels and fills the caches --------------------------------
BUILDER="$WORK/builder"
"$PYTHON" -m venv "$BUILDER"
BPIP=(quiet_pip "$BUILDER/bin/python" -m pip --disable-pip-version-check -q)
"${BPIP[@]}" install --find-links "$WHEELS" "setuptools>=70"
log "building wheels of the Latch packages"
# From copies: pip builds in the source tree, and a build/ directory left in the checkout would
# leak stale modules into later wheels.
mkdir -p "$WORK/src"
for d in "$ROOT"/packages/*/; do
    cp -r "$d" "$WORK/src/"
done
rm -rf "$WORK"/src/*/build "$WORK"/src/*/src/*.egg-info
"${BPIP[@]}" wheel --no-deps --no-build-isolation -w "$WORK/latch-wheels" "$WORK"/src/*/
"${BPIP[@]}" wheel --find-links "$WHEELS" -w "$WHEELS" "setuptools>=70" pytest hypothesis attrs pluggy click ninja numpy rich

# plan.py prints, per package: its local (latch-*) dependency closure and whether it needs torch.
cat > "$WORK/plan.py" <<'PY'
import sys, tomllib
from pathlib import Path
from packaging.requirements import Requirement

root = Path(sys.argv[1])
projects = {}
for d in sorted((root / "packages").iterdir()):
    if (d / "pyproject.toml").exists():
        projects[d.name] = tomllib.loads((d / "pyproject.toml").read_text())["project"]

def reqs(proj, extras=()):
    out = [Requirement(r) for r in proj.get("dependencies", [])]
    for e in extras:
        out += [Requirement(r) for r in proj.get("optional-dependencies", {}).get(e, [])]
    return out

for pkg in sys.argv[2:]:
    proj = projects[pkg]
    # Extras installed too: those that pull in torch ("torch optional" means the package's tests
    # may use it; the no-torch side is covered by packages that declare no torch at all), and the
    # extra named "test", where a package declares what only its tests need (e.g. latch-check's
    # tests build plans with latch-schedule and latch-memory).
    optional = proj.get("optional-dependencies", {})
    extras = [e for e, rs in optional.items()
              if e == "test" or any(Requirement(r).name == "torch" for r in rs)]
    closure, todo, torch = [], [(pkg, extras)], False
    while todo:
        name, ex = todo.pop()
        if name in closure:
            continue
        closure.append(name)
        for r in reqs(projects[name], ex):
            if r.name == "torch":
                torch = True
            elif r.name in projects:
                todo.append((r.name, list(r.extras)))
    print(pkg, ",".join(extras) or "-", "torch" if torch else "no-torch", " ".join(closure))
PY
"${BPIP[@]}" install --find-links "$WHEELS" packaging

if [ ! -f "$TORCH_SITE/.complete" ]; then
    log "installing $TORCH_PIN once into $TORCH_SITE"
    rm -rf "$TORCH_SITE"
    "${BPIP[@]}" install --target "$TORCH_SITE" "$TORCH_PIN"
    touch "$TORCH_SITE/.complete"
fi

wheel_of() {  # distribution name -> its freshly built wheel file
    local f=("$WORK"/latch-wheels/"${1//-/_}"-*.whl)
    [ -f "${f[0]}" ] || { echo "no wheel built for $1" >&2; exit 1; }
    echo "${f[0]}"
}

declare -a RESULTS=()
failed=0
while read -r pkg extras torch closure; do
    log "== $pkg (closure: $closure; $torch)"
    venv="$WORK/venv-$pkg"
    "$PYTHON" -m venv "$venv"
    vpy="$venv/bin/python"
    site="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [ "$torch" = torch ]; then
        echo "$TORCH_SITE" > "$site/_latch_isolation_torch.pth"
    fi
    targets=()
    for dep in $closure; do
        w="$(wheel_of "$dep")"
        if [ "$dep" = "$pkg" ] && [ "$extras" != - ]; then w="$w[$extras]"; fi
        targets+=("$w")
    done
    if ! quiet_pip "$vpy" -m pip --disable-pip-version-check -q install --find-links "$WHEELS" "${targets[@]}" pytest hypothesis; then
        RESULTS+=("$pkg: FAILED to install alone"); failed=1; continue
    fi
    mod="$(echo "${pkg//-/_}")"
    # The installed copy, not the source tree, must be what the tests import.
    where="$(cd "$WORK" && "$vpy" -c "import $mod; print($mod.__file__)")"
    case "$where" in "$venv"/*) ;; *) RESULTS+=("$pkg: imports $mod from $where, not from its venv"); failed=1; continue;; esac
    if [ "$torch" = no-torch ] && "$vpy" -c "import torch" 2>/dev/null; then
        RESULTS+=("$pkg: torch is importable in a venv that must not have it"); failed=1; continue
    fi
    if [ ! -d "$ROOT/packages/$pkg/tests" ]; then
        RESULTS+=("$pkg: installs alone; NO TESTS (packages/$pkg/tests missing)"); continue
    fi
    set +e
    (cd "$ROOT" && "$vpy" -m pytest -q -p no:cacheprovider "${PYTEST_SEL[@]}" "packages/$pkg/tests")
    rc=$?
    set -e
    case $rc in
        0) RESULTS+=("$pkg: ok ($torch)");;
        5) RESULTS+=("$pkg: installs alone; NO TESTS collected");;
        *) RESULTS+=("$pkg: TESTS FAILED (pytest exit $rc)"); failed=1;;
    esac
done < <("$BUILDER/bin/python" "$WORK/plan.py" "$ROOT" "${PACKAGES[@]}")

log "summary"
for r in "${RESULTS[@]}"; do echo "  $r"; done
[ "${#RESULTS[@]}" -eq "${#PACKAGES[@]}" ] || { echo "isolation: the plan covered ${#RESULTS[@]} of ${#PACKAGES[@]} packages" >&2; exit 1; }
exit $failed
