"""Offline stand-in for ansible-test's get-pip bootstrap script.

ansible-test sanity bootstraps pip into each of its virtualenvs by running a
get-pip script it downloads from a host that this project's machines cannot
reach; it looks in ~/.ansible/test/cache/get_pip_<version>.py first. The test
entry point copies this file there. It installs pip from the interpreter's own
ensurepip wheel, then lets that pip install the requested pip version from the
configured package index.
"""

import ensurepip
import os
import subprocess
import sys


def main():
    ensurepip.bootstrap(upgrade=True)
    # Old pip (from ensurepip) rejects these get-pip-only flags.
    args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
    # ensurepip sets PIP_CONFIG_FILE=/dev/null, which hides /etc/pip.conf (index and
    # certificate settings): drop every PIP_* variable for the real install.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
    return subprocess.call([sys.executable, "-m", "pip", "install"] + args, env=env)


if __name__ == "__main__":
    sys.exit(main())
