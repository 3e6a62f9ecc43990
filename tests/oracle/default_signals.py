"""The terminal's signals as a terminal leaves them, for the kvsnap processes a test starts.

kvsnap leaves a signal it was started with ignored ignored (nohup's SIGHUP, the SIGINT of a
script's background job: docs/cli.md "Progress and Ctrl-C"), and an ignored signal stays ignored
across exec. A test that stops kvsnap by a signal must not depend on how the test itself was
started (a CI runner in the background of a script has SIGINT ignored): this gives SIGINT Python's
own handler and SIGHUP, SIGTERM their defaults, so that every process started after it gets the
defaults.

As a program, `python3 default_signals.py CMD [ARG...]` runs CMD with those signals at their
defaults: a shell script cannot undo an ignored SIGINT itself (tests/cli/interrupt_test.sh).
"""
import signal


def restore_default_signals():
    for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL),
                         (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, handler)


if __name__ == "__main__":
    import os
    import sys

    restore_default_signals()  # a Python handler, like any caught signal, is the default after exec
    os.execvp(sys.argv[1], sys.argv[1:])
