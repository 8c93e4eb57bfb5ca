"""``python -m manifold_muon_lab.launch``: ``torchrun`` that ends with the run's exit code and one sentence.

    python -m manifold_muon_lab.launch --nproc_per_node 2 -m manifold_muon_lab.train --preset cpu-tiny

It takes torchrun's command line (torchrun's options, then ``-m module`` or a script, then the script's
options) and runs torchrun's own launcher, ``torch.distributed.run``, in this process. What differs is how
it ends:

* the exit code is the run's: rank 0's (or that of the lowest rank that exited non-zero): 2 for a usage
  error, 3 for a run that diverged, 1 for a bug, 130 or 143 after SIGINT or SIGTERM; torchrun exits 1 for
  all of them;
* the ranks say what happened (``manifold_muon_lab.train`` says it once, on one rank); the launcher prints
  no ChildFailedError report, SignalException traceback or elastic-agent warnings (``--debug`` among the
  script's options, or ``LOGLEVEL`` set, shows them), and adds a sentence of its own only where no rank
  could speak: a rank killed by a signal, an error of the launcher itself, a signal before any rank started;
* SIGINT (Ctrl-C reaches only this process: torchrun starts each rank in a session of its own) and SIGTERM
  are passed on to every rank as they come: the first stops the run at its next step boundary with a
  checkpoint; a second stops it at once (a checkpoint being written completes first); a third stops even
  that write (it is atomic: the previous checkpoint stays); a fourth kills the ranks (SIGKILL, for a rank
  stuck where Python cannot act). Nothing else cuts a checkpoint short (torchrun itself sends SIGKILL 30 s
  after the first signal, whatever the ranks are doing);
* elastic restarts (``--max-restarts``) are refused: a restarted rank would resume a run the user stopped.

A signal while this command starts (torch's import takes seconds) ends it with one sentence and 130/143.
"""

from __future__ import annotations

import os
import signal
import sys

PROG = "python -m manifold_muon_lab.launch"


def _exit_at_once(signum, frame):  # while importing torch: nothing started, nothing written
    os.write(2, f"{PROG}: {signal.Signals(signum).name} while starting: stopped before any rank started, nothing "
                "was written\n".encode())
    os._exit(128 + signum)


if __name__ == "__main__":
    for _sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_sig) is not signal.SIG_IGN:
            signal.signal(_sig, _exit_at_once)

import logging  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from torch.distributed import run as torchrun  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: E402

__all__ = ["main", "PROG"]


class _BeforeStart(Exception):
    """A signal came before any rank had started."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _children() -> list[int]:
    """The pids of this process's children (the ranks; torchrun starts them with Popen), from /proc."""
    me, kids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                kids.append(int(entry))
    return kids


class _Forward:
    """SIGINT/SIGTERM handler of the launcher: pass each signal on to the ranks (the fourth as SIGKILL). A
    thread watches for the first rank to start (``had_ranks``): a signal before it stops the launcher."""

    def __init__(self):
        self.first, self.count, self.had_ranks = None, 0, False
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while not self.had_ranks:
            self.had_ranks = bool(_children())
            time.sleep(0.05)

    def __call__(self, signum, frame):
        self.count += 1
        self.first = self.first or signum
        kids = _children()
        if not kids and not self.had_ranks:
            raise _BeforeStart(signum)  # torchrun's agent closes whatever it had begun to start
        self.had_ranks = self.had_ranks or bool(kids)
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL if self.count >= 4 else signum)
            except ProcessLookupError:
                pass


def _quiet_torch_logs() -> None:
    """Drop the log records of torch.distributed (the agent's warnings, its 'failed (exitcode: 2)' line)."""
    def drop(record):
        return not record.name.startswith("torch.distributed")

    for name in ("torch.distributed", "torch", ""):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(drop)
    if logging.lastResort is not None:
        logging.lastResort.addFilter(drop)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _ended(e: ChildFailedError, forward: _Forward) -> tuple[int, str | None]:
    """The exit code of failed ranks, and a sentence when no rank could say what happened."""
    codes = {rank: f.exitcode for rank, f in sorted(e.failures.items())}
    positive = [rank for rank, c in codes.items() if c > 0]
    killed = {rank: -c for rank, c in codes.items() if c < 0}
    if forward.first is not None:  # the ranks were signalled by us: they said how they stopped
        code = 128 + forward.first
        if forward.count >= 4 and killed:
            return code, (f"{_signal_name(forward.first)} four times: the ranks were killed (SIGKILL); a checkpoint "
                          "they had completed stays (each is written atomically): run the same command again to "
                          "resume from it")
        return code, None
    code = codes[0] if codes.get(0, 0) > 0 else (codes[positive[0]] if positive else None)
    unexplained = {rank: sig for rank, sig in killed.items() if sig != signal.SIGTERM}  # SIGTERM: the agent's own
    if code is not None and not unexplained:
        return code, None
    rank, sig = next(iter(unexplained.items())) if unexplained else next(iter(killed.items()))
    hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if sig == signal.SIGKILL else ""
    return (code if code is not None else 128 + sig), (f"error: rank {rank} (pid {e.failures[rank].pid}) was killed "
                                                       f"by {_signal_name(sig)}{hint}")


def main(argv: list[str] | None = None) -> int:
    """Launch as torchrun would; returns the exit code (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = torchrun.get_args_parser()
    parser.prog = PROG
    args = parser.parse_args(argv)
    if args.max_restarts:
        print(f"{PROG}: error: --max-restarts={args.max_restarts}: this launcher does not restart ranks (one "
              "the user stopped would resume); use torchrun for elastic restarts", file=sys.stderr, flush=True)
        return 2
    debug = "--debug" in args.training_script_args
    if not debug and "LOGLEVEL" not in os.environ:
        _quiet_torch_logs()
    forward = _Forward()
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, forward)
    args.signals_to_handle = ",".join(s for s in args.signals_to_handle.split(",")
                                      if s.strip() not in ("SIGINT", "SIGTERM")) or "SIGHUP"
    code, say = 0, None
    try:
        torchrun.run(args)
    except _BeforeStart as e:
        code, say = 128 + e.signum, (f"{_signal_name(e.signum)} while starting: stopped before any rank started, "
                                     "nothing was written")
    except ChildFailedError as e:
        if debug:
            raise
        code, say = _ended(e, forward)
    except Exception as e:  # noqa: BLE001 - the launcher's own failure (rendezvous, options): one sentence
        if debug:
            raise
        text = " ".join(str(e).split()) or type(e).__name__
        code, say = (2 if isinstance(e, (ValueError, TypeError)) else 1), f"error: {type(e).__name__}: {text}"
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the run is over: its exit code stands
            if signal.getsignal(sig) is forward:
                signal.signal(sig, signal.SIG_IGN)
    if say:
        print(f"{PROG}: {say}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
