"""Lab guests only: keep the byte code of modules imported from zip archives (Ansible's AnsiballZ payloads).

Python never caches what it compiles from a zip archive, so every Ansible task in a TCG guest compiled
ansible.module_utils.basic and the collection's module_utils again (about a second per task under TCG). This hook
keys the compiled code by the SHA-256 of the exact source bytes and the name inside the archive: the same source
gives the same code object, so a module's behaviour cannot change, only its start-up time. The cache is root's
(mode 0700); a process that cannot use it compiles as usual.
"""

import hashlib
import marshal
import os
import types
import zipimport

CACHE = "/var/cache/gpunode-lab-pyc"
_compile = zipimport._compile_source  # pylint: disable=protected-access


def _refile(code, filename):
    consts = tuple(_refile(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _compile_source(pathname, source):
    inner = pathname.split(".zip" + os.sep, 1)[-1]
    key = hashlib.sha256(inner.encode() + b"\0" + source).hexdigest()
    path = os.path.join(CACHE, key)
    try:
        with open(path, "rb") as handle:
            return _refile(marshal.load(handle), pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile(pathname, source)
    try:
        tmp = "%s.%d" % (path, os.getpid())
        with open(tmp, "wb") as handle:
            marshal.dump(code, handle)
        os.rename(tmp, path)
    except OSError:
        pass
    return code


if hasattr(zipimport, "_compile_source") and os.path.isdir(CACHE) and os.access(CACHE, os.W_OK | os.X_OK):
    zipimport._compile_source = _compile_source  # pylint: disable=protected-access
