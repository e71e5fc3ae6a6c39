"""The ctypes structs of kittykv/_lib.py have the C compiler's layout: a C
program built against include/ prints sizeof and offsetof of every mirrored
struct and field, and they must equal ctypes' figures. A header change not
mirrored in the bindings fails here instead of corrupting memory."""
import ctypes
import os
import shutil
import subprocess

import pytest

from kittykv import _lib


def test_struct_layout_matches_the_headers(root, tmp_path):
    inc = os.path.join(root, "include")
    if not os.path.exists(os.path.join(inc, "kittykv_eval.h")):
        pytest.skip(f"no headers at {inc}")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed for the layout check"
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <kittykv_eval.h>",
             "int main(void) {"]
    for cname, py in _lib.STRUCTS.items():
        lines.append(f'    printf("{cname} %zu\\n", sizeof({cname}));')
        for f, _ in py._fields_:
            lines.append(f'    printf("{cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    lines += ["    return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    p = subprocess.run([cc, "-std=c11", "-I", inc, str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr  # a field the header does not have
    got = dict(line.rsplit(" ", 1) for line in
               subprocess.run([str(exe)], capture_output=True, text=True,
                              check=True).stdout.splitlines())
    for cname, py in _lib.STRUCTS.items():
        assert int(got[cname]) == ctypes.sizeof(py), cname
        for f, _ in py._fields_:
            assert int(got[f"{cname}.{f}"]) == getattr(py, f).offset, f"{cname}.{f}"
