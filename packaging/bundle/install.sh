#!/bin/sh
# Installs memagent @VERSION@ from this bundle, with no network (README.md beside this file).
#
#   ./install.sh [PREFIX] [--bindir DIR] [--python PYTHON] [--private] [--daemon-only] [--no-service] [--root DIR]
#
# PREFIX (default /opt/memagent; also --prefix DIR) gets a virtual environment with
# memagent[tui] (--daemon-only: memagent alone) from wheels/, with pip --no-index: nothing is
# downloaded. DIR (default /usr/local/bin; --bindir '' for none) gets links to memagent and
# memtop. Then, as root and without --no-service: `memagent install-service` where this
# memagent has that command (the unit, /etc/memagent/memagent.toml, the group memagent);
# --root DIR: its files go under DIR instead (as DESTDIR; systemd and the group left alone).
# As root, the interpreter must be one every user can run (not a pyenv or conda under
# root's home): the system's is preferred; --private accepts one only root can run.
# Run it again from a newer bundle to upgrade, then restart the daemon.
set -eu

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: %s\n' "$1" >&2; exit "${2:-1}"; }
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
# Why other users could not run the environment made from interpreter $1 (its program or
# its standard library under a directory they may not enter, as a pyenv or conda under
# root's home, mode 0700); nothing when they can. As root only: the service and every
# user's memagent and memtop run it.
private_why() {
    [ "$(id -u)" -eq 0 ] && [ "$private" = no ] || return 0
    "$1" - <<'PY' 2>/dev/null || true
import os, stat, sys
def refused(path, need):
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        here = os.sep.join(parts[:i]) or os.sep
        bits = need if i == len(parts) else stat.S_IXOTH
        if os.stat(here).st_mode & bits != bits:
            return here
    return None
lib = os.path.dirname(os.__file__)
for path, need in ((sys.executable, stat.S_IXOTH), (lib, stat.S_IXOTH | stat.S_IROTH)):
    where = refused(path, need)
    if where:
        print(f"{os.path.realpath(path)} is under {where}, which other users may not enter or read")
        break
PY
}

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
# MEMAGENT_VERSION, BUNDLE_PYTHON (the wheels' Python, X.Y), BUNDLE_PLATFORM
. "$here/bundle.env"

prefix=/opt/memagent
bindir=/usr/local/bin
python=
extras='[tui]'
service=yes
root=
private=no
while [ $# -gt 0 ]; do
    case $1 in
        --prefix|--bindir|--python|--root)
            [ $# -ge 2 ] || die "$1 needs a value" 2
            case $1 in --prefix) prefix=$2 ;; --bindir) bindir=$2 ;; --python) python=$2 ;; --root) root=$2 ;; esac
            shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --root=*) root=${1#*=}; shift ;;
        --bindir=*) bindir=${1#*=}; shift ;;
        --python=*) python=${1#*=}; shift ;;
        --daemon-only) extras=; shift ;;
        --no-service) service=no; shift ;;
        --private) private=yes; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option: $1" 2 ;;
        *) prefix=$1; shift ;;
    esac
done
[ -n "$prefix" ] || die "an empty prefix" 2
case $prefix in /*) ;; *) prefix=$(pwd)/$prefix ;; esac

# The wheels are built for one Python version (compiled parts: psutil, msgpack).
# The system's interpreter first (/usr/bin), then PATH's; as root, one that other users can
# run (issue 28: a pyenv in root's home gave every other user "Permission denied").
if [ -z "$python" ]; then
    skipped=
    for candidate in "/usr/bin/python$BUNDLE_PYTHON" "/usr/local/bin/python$BUNDLE_PYTHON" "python$BUNDLE_PYTHON" python3; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        [ "$(version_of "$candidate")" = "$BUNDLE_PYTHON" ] || continue
        why=$(private_why "$candidate")
        if [ -n "$why" ]; then
            skipped="$skipped; passed over $(command -v "$candidate"): $why"
            continue
        fi
        python=$(command -v "$candidate")
        break
    done
    [ -n "$python" ] || die "this bundle is for Python $BUNDLE_PYTHON and there is no python$BUNDLE_PYTHON here \
that every user can run$skipped: give one with --python (e.g. --python /usr/bin/python$BUNDLE_PYTHON after \
apt-get install python$BUNDLE_PYTHON-venv), or build a bundle for this box's Python (make bundle PYTHON=python3.X)"
elif [ "$(version_of "$python")" != "$BUNDLE_PYTHON" ]; then
    die "$python is not Python $BUNDLE_PYTHON, which this bundle's wheels are for"
else
    why=$(private_why "$python")
    [ -z "$why" ] || die "$python cannot be run by other users ($why): the service and every user's memagent \
would fail with 'Permission denied'; give --python an interpreter outside such a directory (e.g. \
/usr/bin/python$BUNDLE_PYTHON), or --private if only root will run memagent here"
fi
"$python" -c 'import ensurepip, venv' 2>/dev/null \
    || die "$python cannot create a virtual environment: install python$BUNDLE_PYTHON-venv (Debian, Ubuntu)"

# Nothing may be downloaded: pip sees only wheels/, whatever this box's pip configuration
# says (indexes, find-links, constraints), as ensurepip does it.
for variable in $(env | sed -n 's/^\(PIP_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$variable"; done
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [ -f "$prefix/pyvenv.cfg" ] && [ "$(version_of "$prefix/bin/python")" = "$BUNDLE_PYTHON" ]; then
    say "upgrading the environment in $prefix"
elif [ -f "$prefix/pyvenv.cfg" ] || [ ! -e "$prefix" ] || [ -z "$(ls -A "$prefix")" ]; then
    "$python" -m venv --clear "$prefix"
else
    die "$prefix exists and is not a virtual environment: give another prefix"
fi
"$prefix/bin/python" -m pip --isolated --disable-pip-version-check install --quiet --no-index \
    --find-links "$here/wheels" --upgrade "memagent$extras==$MEMAGENT_VERSION"

if [ -n "$bindir" ]; then
    mkdir -p "$bindir"
    for command in memagent memtop; do
        ln -sf "$prefix/bin/$command" "$bindir/$command"
    done
fi

if [ "$service" = yes ] && [ "$(id -u)" -eq 0 ]; then
    if "$prefix/bin/memagent" install-service --help >/dev/null 2>&1; then
        "$prefix/bin/memagent" install-service ${root:+--root "$root"}
    else
        say "this memagent has no install-service command: install the unit by hand (README.md, \"The service\")"
    fi
elif [ "$service" = yes ]; then
    say "not root: no service installed (as root: memagent install-service)"
fi

say "memagent $MEMAGENT_VERSION installed in $prefix ($("$prefix/bin/memagent" --version))"
