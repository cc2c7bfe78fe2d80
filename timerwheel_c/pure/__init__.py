"""The pure-Python twins of the compiled cores, importable side by side with them.

Each module here mirrors ``src/_<name>.pyx`` function by function, with the same
names in the same order, so the two can be diffed by eye.
"""
from .release import Deadline, ReleaseTimer
from .wheel import TimerWheel

__all__ = ["Deadline", "ReleaseTimer", "TimerWheel"]
