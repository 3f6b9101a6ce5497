#!/usr/bin/env bash
# The project's single entry point.
#
#   ./run.sh diagnose [ansible-playbook args...]  install, then diagnose this machine (read-only); with
#                                                 -i INVENTORY, the inventory's hosts over their own connection
#   ./run.sh test                                 install, then the whole test suite, in order:
#                                                 unit, oldest, sanity, lint, molecule
#   ./run.sh molecule [SCENARIO...]               the named Molecule scenarios (default: all)
#   ./run.sh deps | unit | oldest | sanity | lint | lab-down
#                                                 (oldest: the unit and integration tests on the
#                                                 oldest supported ansible-core, requirements-oldest.txt)
#   ./run.sh mutants [AREA|PATH...]               mutation testing (mutmut) of the decision code, per
#                                                 area with the tests that cover it; not part of test
#
# Needs root: it installs Debian packages and the lab boots QEMU guests with
# tap devices. With no argument it prints this help.
# Runs as root on Debian 12 with nothing but python3 (and bash) installed:
# missing Debian packages are installed with apt-get, Python tooling goes into
# .venv from requirements-dev.txt (pinned).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$ROOT" || exit 1
VENV="$ROOT/.venv"
VENV_OLDEST="$ROOT/.venv-oldest"
COLLECTIONS="$ROOT/build/collections"
export PATH="$VENV/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$COLLECTIONS"
export ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false
export ANSIBLE_FORCE_COLOR="${ANSIBLE_FORCE_COLOR:-0}"
export PY_COLORS="${PY_COLORS:-0}"

# Debian packages per purpose. The lab's come from bindep.txt's [test] profile.
DEB_BASE=(python3-venv git ethtool iproute2)
DEB_TEST=(qemu-system-x86 qemu-utils debootstrap openssh-client util-linux e2fsprogs shellcheck chromium grub-common)

log() { printf '\n=== %s\n' "$*"; }

missing_debs() {
    local pkg out=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || out+=("$pkg")
    done
    printf '%s\n' "${out[@]}"
}

install_debs() {
    local missing
    mapfile -t missing < <(missing_debs "$@" | sed '/^$/d')
    [ "${#missing[@]}" -eq 0 ] && return 0
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

python_venv_ok() { python3 -c 'import ensurepip, venv' 2>/dev/null; }

ensure_venv() {
    # ensure_venv DIR REQUIREMENTS: DIR is a virtualenv with exactly REQUIREMENTS installed (redone when the file changes).
    local dir=$1 req=$2 stamp="$1/.requirements.sha256" sum
    sum=$(sha256sum "$req" | cut -d' ' -f1)
    if [ ! -x "$dir/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
        log "pip install -r $req into ${dir#"$ROOT"/}"
        python3 -m venv "$dir" || return 1
        "$dir/bin/pip" install -q --disable-pip-version-check -r "$req" || return 1
        echo "$sum" > "$stamp"
    fi
}

deps() {
    local want=("${DEB_BASE[@]}")
    [ "${1:-}" = test ] && want+=("${DEB_TEST[@]}")
    # python3-venv only matters when the interpreter lacks venv/ensurepip (Debian's does).
    if python_venv_ok; then want=("${want[@]/python3-venv/}"); fi
    mapfile -t want < <(printf '%s\n' "${want[@]}" | sed '/^$/d')
    install_debs "${want[@]}" || return 1
    ensure_venv "$VENV" requirements-dev.txt || return 1
    # The collection as Ansible finds it: build/collections/ansible_collections/gpunode/tuning -> repo.
    mkdir -p "$COLLECTIONS/ansible_collections/gpunode"
    ln -sfn "$ROOT" "$COLLECTIONS/ansible_collections/gpunode/tuning"
}

step_unit() {
    # Both cores (pytest-xdist); a test file stays on one worker, so its module fixtures run once.
    python -m pytest -q -p no:cacheprovider -n "${GPUNODE_UNIT_WORKERS:-2}" --dist loadfile tests/unit tests/integration
    local rc=$?
    # Exit code 5 means pytest collected no tests: for this suite that is a broken
    # test tree, not a pass.
    if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing the unit step" >&2; fi
    return "$rc"
}

step_oldest() {
    # The unit and integration tests (their localhost playbook runs included) on the oldest supported ansible-core
    # (requirements-oldest.txt, meta/runtime.yml), in .venv-oldest; the unit step ran them on the newest.
    ensure_venv "$VENV_OLDEST" requirements-oldest.txt || return 1
    PATH="$VENV_OLDEST/bin:$PATH" "$VENV_OLDEST/bin/python" -m pytest -q -p no:cacheprovider \
        -n "${GPUNODE_UNIT_WORKERS:-2}" --dist loadfile tests/unit tests/integration
    local rc=$?
    if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing the oldest step" >&2; fi
    return "$rc"
}

step_sanity() {
    # ansible-test needs the collection at .../ansible_collections/gpunode/tuning and
    # reads every file there: copy exactly what git would ship (tracked + untracked,
    # not ignored).
    # The copy lives outside the repository: inside it, ansible-test would ask git
    # and find the tree ignored.
    local base="${TMPDIR:-/tmp}/gpunode-sanity"
    local tree="$base/ansible_collections/gpunode/tuning"
    rm -rf "$base" && mkdir -p "$tree"
    git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, shutil, sys
dest = sys.argv[1]
for name in sys.stdin.buffer.read().decode().split("\0"):
    if name and os.path.isfile(name) and not name.startswith(".ci/"):
        os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
        shutil.copy2(name, os.path.join(dest, name))
' "$tree" || return 1
    # Offline pip bootstrap for ansible-test's own virtualenvs (see ../shared/LAB.md).
    local cache="$HOME/.ansible/test/cache"
    mkdir -p "$cache"
    local ver
    ver=$(python - <<'EOF'
import re, ansible_test, pathlib
src = (pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", src).group(1).replace(".", "_"))
EOF
)
    cp tests/tools/get_pip_standin.py "$cache/get_pip_${ver}.py"
    (cd "$tree" && ansible-test sanity --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" --color no)
}

step_lint() {
    ansible-lint --profile production --offline -q
}

scenarios() {
    local d
    for d in molecule/*/; do
        d=${d%/}; d=${d#molecule/}
        case "$d" in _*) continue ;; esac
        [ -f "molecule/$d/molecule.yml" ] && echo "$d"
    done
}

stamp_steps() {
    # Molecule's step lines ("INFO [scenario > step] Executing/Executed") get the seconds since the scenario began.
    local t0=$SECONDS line
    while IFS= read -r line; do
        case "$line" in
            INFO*) printf '[+%4d s] %s\n' "$((SECONDS - t0))" "$line" ;;
            *) printf '%s\n' "$line" ;;
        esac
    done
}

step_molecule() {
    local list rc=0 s t0 known
    if [ "$#" -gt 0 ]; then
        list=("$@")
        mapfile -t known < <(scenarios)
        for s in "${list[@]}"; do
            if ! printf '%s\n' "${known[@]}" | grep -qxF -- "$s"; then
                echo "unknown scenario '$s'; known: ${known[*]}" >&2
                return 2
            fi
        done
    else
        mapfile -t list < <(scenarios)
    fi
    if [ "${#list[@]}" -eq 0 ]; then echo "no molecule scenarios"; return 1; fi
    python3 tests/lab/lab.py build || return 1
    local out digest
    out=$(mktemp) && digest=$(mktemp) || return 1
    trap 'python3 tests/lab/lab.py down --all >/dev/null 2>&1; rm -f "${out:-}" "${digest:-}"; trap - RETURN' RETURN
    for s in "${list[@]}"; do
        t0=$SECONDS
        log "molecule test -s $s"
        if PYTHONUNBUFFERED=1 flock /tmp/gpunode-molecule.lock molecule test -s "$s" 2>&1 | stamp_steps | tee "$out"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
            echo "scenario $s: passed in $((SECONDS - t0)) s"
        else
            echo "scenario $s: FAILED after $((SECONDS - t0)) s"
            failure_digest "$s" "$out" >>"$digest"
            rc=1
        fi
    done
    python3 tests/lab/lab.py down --all
    # What failed, again at the end: a CI log is often kept only as its tail.
    [ -s "$digest" ] && cat "$digest"
    return "$rc"
}

failure_digest() {
    # failure_digest SCENARIO LOG: the failed Ansible tasks (their TASK line and the fatal/failed result) and the
    # failing pytest assertions of one scenario's output, bounded.
    echo
    echo "=== scenario $1 failed: what failed ==="
    awk '
        /^TASK \[/ { task = $0; n = 0 }
        /^PLAY RECAP/ { n = 0 }
        /^(fatal|failed): \[/ || /FAILED! =>/ { if (task != "") print task; task = ""; n = 12 }
        n > 0 { print; n-- }
    ' "$2" | cut -c1-400 | head -60
    grep -E "^(E  |FAILED |ERROR )" "$2" | grep -v "^FAILED - RETRYING" | cut -c1-400 | head -40
    echo "=== end of scenario $1 ==="
}

run_steps() {
    # run_steps STEP... [-- ARGS for the last step]
    local passed=0 failed=0 failed_names=() s t0 summary=() steps=() args=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do steps+=("$1"); shift; done
    [ "${1:-}" = "--" ] && { shift; args=("$@"); }
    for s in "${steps[@]}"; do
        t0=$SECONDS
        log "step $s"
        if if [ "$s" = "${steps[-1]}" ]; then "step_$s" "${args[@]}"; else "step_$s"; fi; then
            passed=$((passed + 1)); summary+=("$s=ok($((SECONDS - t0))s)")
        else
            failed=$((failed + 1)); failed_names+=("$s"); summary+=("$s=FAILED($((SECONDS - t0))s)")
        fi
    done
    echo
    echo "summary: ${summary[*]}"
    echo "steps: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

usage() { sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; }

cmd=${1:-}
shift || true
if [ -z "$cmd" ] || [ "$cmd" = "-h" ] || [ "$cmd" = "--help" ] || [ "$cmd" = "help" ]; then
    usage; exit 0
fi
need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "run.sh $cmd: needs root (it installs missing Debian packages with apt-get, and the lab boots" \
             "QEMU guests on tap devices); run it as root, e.g. sudo ./run.sh $cmd" >&2
        exit 1
    fi
}
# The ansible-playbook command of ./run.sh diagnose ARGS, in DIAGNOSE_ARGV. With an inventory in ARGS (-i, -iINV,
# --inventory[=INV]) the play runs against the inventory's hosts over their normal connection (ssh), with their own
# Python; without one, against this machine (-c local, the venv's Python). tests/integration/test_run_sh_diagnose.py
# runs this function.
diagnose_argv() {
    local arg inventory=""
    for arg in "$@"; do
        case "$arg" in -i | -i?* | --inventory | --inventory=* | --inventory-file | --inventory-file=*) inventory=1 ;; esac
    done
    if [ -n "$inventory" ]; then
        DIAGNOSE_ARGV=(ansible-playbook playbooks/diagnose.yml "$@")
    else
        DIAGNOSE_ARGV=(ansible-playbook -i "localhost," -c local -e "ansible_python_interpreter=$VENV/bin/python"
                       playbooks/diagnose.yml "$@")
    fi
}
case "$cmd" in deps | test | unit | oldest | sanity | lint | molecule | diagnose | lab-down) need_root ;; esac
case "$cmd" in
    deps) deps test ;;
    test)
        deps test || { echo "steps: 0 passed, 1 failed (deps)"; exit 1; }
        run_steps unit oldest sanity lint molecule ;;
    unit | oldest | sanity | lint)
        deps test || exit 1
        run_steps "$cmd" ;;
    molecule)
        deps test || exit 1
        run_steps molecule -- "$@" ;;
    diagnose)
        deps || exit 1
        diagnose_argv "$@"
        "${DIAGNOSE_ARGV[@]}" ;;
    lab-down) python3 tests/lab/lab.py down --all ;;
    mutants)
        deps || exit 1
        "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-mutants.txt || exit 1
        nice -n 19 python tests/tools/mutants.py "$@" ;;
    *) echo "run.sh: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac
