# A module that starts a thread when imported (as OpenBLAS does when torch loads it without
# OMP_NUM_THREADS): test_spares.py idle_threads preloads it in a spare importing at idle priority.
import threading

threading.Thread(target=threading.Event().wait, name="started-at-import", daemon=True).start()
