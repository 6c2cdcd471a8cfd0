"""One scripts/reference/fsdp2_llama.py --serve per test process: run(argv) does what
`python fsdp2_llama.py ARGV` does, without importing torch, transformers and PEFT again for each
reference (about 6 s of one core each; lora_python_test runs 22 references).

    from reference_server import references
    done = references(source).run(["--model", folder, ...], timeout=600)
    done.returncode, done.stdout  # as subprocess.run(..., capture_output=True, text=True) gives them

stdout holds the reference's standard output and error together; stderr is empty.
"""
import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

_servers = {}


class ReferenceServer:
    def __init__(self, script):
        self.script = script
        self.process = None
        self.folder = tempfile.mkdtemp(prefix="reference-server-")
        self.count = 0

    def _start(self):
        # Its own session, so a timeout ends the server and every rank it forked.
        self.process = subprocess.Popen([sys.executable, self.script, "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)

    def run(self, argv, timeout=600):
        """The reference with arguments `argv`, as a subprocess.CompletedProcess; a run past `timeout`
        seconds ends the server (the next run starts another) and raises subprocess.TimeoutExpired."""
        argv = [str(a) for a in argv]
        if self.process is None or self.process.poll() is not None:
            self._start()
        self.count += 1
        output = os.path.join(self.folder, f"run-{self.count}.log")
        self.process.stdin.write(json.dumps({"argv": argv, "output": output}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.close(kill=True)
            raise subprocess.TimeoutExpired([self.script, *argv], timeout, output=_read(output))
        line = self.process.stdout.readline()
        if not line:  # the server itself ended (its error is on this test's standard error)
            code = self.process.wait() or 1
            self.process = None
            return subprocess.CompletedProcess([self.script, *argv], code, _read(output),
                                               "the reference server ended before answering")
        code = json.loads(line)["returncode"]
        return subprocess.CompletedProcess([self.script, *argv], code, _read(output, remove=True), "")

    def close(self, kill=False):
        if self.process is None:
            return
        if kill:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            self.process.stdin.close()
        self.process.wait()
        self.process = None

    def remove(self):
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _read(path, remove=False):
    """The text of a run's output file (removed once read, when `remove`: a killed test leaves at
    most the empty folder)."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
        if remove:
            os.remove(path)
        return text
    except FileNotFoundError:
        return ""


def references(source):
    """The server for the checkout at `source`, started at the first run and ended when the test ends."""
    script = os.path.join(source, "scripts", "reference", "fsdp2_llama.py")
    if script not in _servers:
        _servers[script] = ReferenceServer(script)
        atexit.register(_servers[script].remove)
    return _servers[script]
