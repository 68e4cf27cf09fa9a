"""tests/libdhs/install_test.py: `meson install` installs libdhs's header, library and pkg-config file, and a program
built from the installed files alone (examples/serve_two.c with `pkg-config --cflags --libs dhs`) serves two
requests against a real memd (issue 25).

Usage: install_test.py BUILD_DIR SERVE_TWO_C WITH_MEMD MEMD"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile


def main() -> int:
    build, source, with_memd, memd = sys.argv[1:5]
    dest = tempfile.mkdtemp(prefix="dhs-install-")
    try:
        subprocess.run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"], check=True,
                       stdout=subprocess.DEVNULL)
        pcs = glob.glob(os.path.join(dest, "**", "pkgconfig", "dhs.pc"), recursive=True)
        headers = glob.glob(os.path.join(dest, "**", "include", "dhs", "dhs.h"), recursive=True)
        libs = glob.glob(os.path.join(dest, "**", "libdhs.so.1"), recursive=True)
        print("installed:", [os.path.relpath(p, dest) for p in pcs + headers + libs])
        if len(pcs) != 1 or len(headers) != 1 or len(libs) != 1:
            print("missing: dhs.pc, dhs/dhs.h or libdhs.so.1 under", dest)
            return 1
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]), PKG_CONFIG_SYSROOT_DIR=dest)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "dhs"], env=env, check=True, capture_output=True,
                               text=True).stdout.split()
        print("pkg-config --cflags --libs dhs:", " ".join(flags))
        exe = os.path.join(dest, "serve_two")
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-std=c11", "-Wall", "-Werror", source, "-o", exe] + flags, check=True)
        run_env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(libs[0]))
        run_env.pop("DHS_LIBRARY", None)
        rc = subprocess.call([sys.executable, with_memd, memd, "2304", "256", "--", exe, "@RUN_DIR@"], env=run_env)
        if rc != 0:
            return rc
        # The Python binding, installed: `import dhs` finds the installed libdhs.so.1 through the loader.
        pkgs = glob.glob(os.path.join(dest, "**", "dhs", "__init__.py"), recursive=True)
        print("python binding:", [os.path.relpath(p, dest) for p in pkgs])
        if len(pkgs) != 1:
            return 1
        run_env["PYTHONPATH"] = os.path.dirname(os.path.dirname(pkgs[0]))
        probe = ("import dhs; l = dhs.library(); print('binding loaded', l._name, 'ABI', hex(l.dhs_version()));"
                 "assert l._name == 'libdhs.so.1'")
        return subprocess.call([sys.executable, "-c", probe], env=run_env)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
