"""``timerwheel-c run``: placeholder until issue 4 lands."""


def add_parser(sub):
    p = sub.add_parser("run", help="serve durable timers from a store")
    p.set_defaults(func=lambda args: 0)
