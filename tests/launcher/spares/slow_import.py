# A module whose import takes long without using CPU (as a starved import looks from outside):
# test_spares.py starved_idle preloads it, so the spares are still importing at the restart.
import time

time.sleep(60)
