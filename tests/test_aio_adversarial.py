"""Regression tests for WheelScheduler bugs found by adversarial testing.

Each test was xfail(strict=True) until its fix landed; all are fixed now.
"""
import asyncio


def test_close_from_callback_skips_rest_of_batch_quietly(aio_impl):
    """``close()`` is documented "safe from inside a callback: the rest of the batch does not
    run". The rest of the batch was once still popped from the old handle dict and run with its
    callback cleared, so the loop's exception handler got a bogus "Exception in callback
    NoneNone" TypeError. Both callbacks share one due time (same call_at), so they are always in
    one batch; the 100 ms sleep is a generous liveness bound for a 20 ms timer."""

    async def main():
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        sched = aio_impl.WheelScheduler()
        ran = []
        when = loop.time() + 0.02
        sched.call_at(when, lambda: (ran.append(1), sched.close()))
        sched.call_at(when, lambda: ran.append(2))
        await asyncio.sleep(0.1)
        return ran, errors

    ran, errors = asyncio.run(main())
    assert ran == [1], "the first callback did not run: the test proved nothing"
    assert errors == [], [ctx.get("message") for ctx in errors]
