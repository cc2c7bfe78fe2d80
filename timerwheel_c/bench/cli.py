"""``timerwheel-c bench``: placeholder until issue 5 lands."""


def add_parser(sub):
    p = sub.add_parser("bench", help="run the side-by-side benchmarks")
    p.set_defaults(func=lambda args: 0)
