"""The side-by-side benchmarks behind ``python -m timerwheel_c bench``."""
