"""tests/libdhs/with_memd.py: runs a command against a real memd in a fresh run directory (issue 25's examples).

Usage: with_memd.py MEMD PAGE_BYTES HOST_PAGES [--skip-without-numpy] -- CMD [ARGS...]
Every argument of CMD equal to @RUN_DIR@ becomes the run directory. memd is started with --page-bytes PAGE_BYTES
--host-pool-pages HOST_PAGES (and the words of $MEMD_EXTRA_ARGS, e.g. "--prefix-sharing on"), the command runs once memd.sock exists, then memd gets SIGTERM (SIGKILL after 10 s)
and the run directory is removed. Exits with the command's status (77 = skipped, meson's code, is passed on)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from proc_util import wait_until  # noqa: E402


def main() -> int:
    sep = sys.argv.index("--")
    memd, page_bytes, host_pages = sys.argv[1:4]
    cmd = sys.argv[sep + 1:]
    run_dir = tempfile.mkdtemp(prefix="dhs-lib-", dir="/tmp")
    os.rmdir(run_dir)  # memd creates it (0700)
    log = open(run_dir + ".memd.log", "w")
    proc = subprocess.Popen([memd, "--run-dir", run_dir, "--page-bytes", page_bytes, "--host-pool-pages",
                             host_pages, "--worker-timeout-ms", "20000"] + os.environ.get("MEMD_EXTRA_ARGS", "").split(),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        if not wait_until(lambda: os.path.exists(os.path.join(run_dir, "memd.sock")) or proc.poll() is not None, 20):
            print("memd did not start", file=sys.stderr)
            return 1
        if proc.poll() is not None:
            print("memd exited:", open(run_dir + ".memd.log").read(), file=sys.stderr)
            return 1
        start = time.monotonic()
        rc = subprocess.call([run_dir if a == "@RUN_DIR@" else a for a in cmd])
        name = os.path.basename(cmd[1] if "python" in os.path.basename(cmd[0]) and len(cmd) > 1 else cmd[0])
        print(f"with_memd: {name} exited {rc} after "
              f"{time.monotonic() - start:.2f} s")
        return rc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        text = open(run_dir + ".memd.log").read()
        if proc.returncode not in (0, -signal.SIGTERM):
            print("memd log:\n" + text, file=sys.stderr)
        # memd keeps its host pool while requests hold host copies (a command that left interrupted requests):
        # nothing is left in /dev/shm after a test.
        seg = re.search(r"host pool /dev/shm/([^:\s]+):", text)
        if seg and os.path.exists("/dev/shm/" + seg.group(1)):
            os.unlink("/dev/shm/" + seg.group(1))
        shutil.rmtree(run_dir, ignore_errors=True)
        os.unlink(run_dir + ".memd.log")


if __name__ == "__main__":
    sys.exit(main())
