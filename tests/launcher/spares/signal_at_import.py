# A module that installs a signal handler when imported (signal.signal works on the main thread
# only): test_spares.py main_thread_import preloads it in a spare importing at idle priority.
import signal

signal.signal(signal.SIGUSR2, signal.SIG_IGN)
