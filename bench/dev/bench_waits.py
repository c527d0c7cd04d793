"""How late a blocking dense call on the NCCL backend returns after its device work finished.

One process runs the NCCL backend's own code over a stand-in device whose events complete a
fixed time after they are recorded (the duration of the "device work"), with a null NCCL. A
blocking call is ``cc.allreduce(x, out=out)`` then ``comm.synchronize()``; its lateness is the
time from the moment its event completed (or from the call, when it completed earlier) to the
return of ``synchronize()``; its CPU time is the process's over the call and the wait. Three
wait policies run side by side, interleaved call by call: ``spin`` (the backend's,
``cupycoll.comm._nccl_guard.spin``: back-to-back polls, then polls that yield, then sleeps that
lengthen with the wait, ``comm._naps.nap``), ``fixed`` (the same with every sleep 0.1 ms, as
before the sleeps lengthened) and ``sleep`` (sleeps from 10 us doubling to 1 ms between polls,
the policy before the spin). Medians of ``-n`` calls per row, microseconds;
the host time of the call itself is ``bench/dev/bench_host.py``'s.

    python bench/dev/bench_waits.py -n 400
    python bench/dev/bench_waits.py -n 20 --durations 0.02,0.3
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

from cupycoll._arguments import positive_int
import cupycoll as cc
from cupycoll.comm import _naps, _nccl_guard, _nccl_stream

from bench_host import _HostDevice, _NullNccl


class _TimedDevice(_HostDevice):
    """A stand-in device whose events are done ``duration`` seconds after they are recorded."""

    class Timed:
        __slots__ = ("at",)

        def __init__(self, at: float) -> None:
            self.at = at

        @property
        def done(self) -> bool:
            return time.perf_counter() >= self.at

        def synchronize(self) -> None:
            while not self.done:
                pass

    def __init__(self) -> None:
        super().__init__()
        self.duration = 0.0

    def record(self, stream: Any = None) -> "_TimedDevice.Timed":
        return self.Timed(time.perf_counter() + self.duration)


def sleeping(ready: Callable[[], bool]) -> None:
    """The former wait policy: sleep 10 us, doubling to 1 ms, between polls."""
    pause = 1e-5
    while not ready():
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def fixed_naps(ready: Callable[[], bool]) -> None:
    """The backend's ``spin`` with every sleep NAP_MIN (0.1 ms), however long the wait."""
    _nccl_guard.nap = lambda waited: _naps.NAP_MIN
    try:
        _nccl_guard.spin(ready)
    finally:
        _nccl_guard.nap = _naps.nap


def overheads(durations: list[float], iters: int
              ) -> dict[tuple[str, float], tuple[float, float]]:
    """Median (lateness, CPU time) in us of a blocking allreduce per (policy, duration)."""
    from cupy.cuda import nccl

    from cupycoll.comm.nccl import NCCLCommunicator

    device = _TimedDevice()
    comm = NCCLCommunicator.wrap(_NullNccl(), nccl=nccl, device=device, xp=np)
    x, out = np.ones(256, np.float32), np.empty(256, np.float32)
    policies = {"spin": _nccl_stream.spin, "fixed": fixed_naps, "sleep": sleeping}
    times: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for duration in durations:
        device.duration = duration
        for i in range(iters + 5):
            for name, policy in policies.items():
                _nccl_stream.spin = policy
                cpu = time.process_time()
                cc.allreduce(x, out=out, comm=comm)
                done_at = comm._inflight.newest().event.at  # when the device work "finished"
                comm.synchronize()
                late = time.perf_counter() - done_at
                cpu = time.process_time() - cpu
                if i >= 5:  # warm-up calls left out
                    times.setdefault((name, duration), []).append((late, cpu))
    _nccl_stream.spin = policies["spin"]
    return {key: tuple(float(m) * 1e6 for m in np.median(np.array(v), axis=0))
            for key, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--iters", type=positive_int, default=400)
    parser.add_argument("--durations", default="5e-6,1e-4,3e-3",
                        help="seconds of device work per call, comma-separated")
    args = parser.parse_args()
    cc.init("mpi")
    durations = [float(d) for d in args.durations.split(",")]
    result = overheads(durations, args.iters)
    print(f"# a blocking dense call (median of {args.iters}, us): lateness from the end of its "
          "device work to the return of comm.synchronize(), and CPU time")
    names = ("spin", "fixed", "sleep")
    print(f"# {'device work (us)':>18}" + "".join(f"{'late ' + n:>12}" for n in names)
          + "".join(f"{'cpu ' + n:>12}" for n in names))
    for duration in durations:
        late = [result[(n, duration)][0] for n in names]
        cpu = [result[(n, duration)][1] for n in names]
        print(f"  {duration * 1e6:>18.0f}" + "".join(f"{v:>12.1f}" for v in late + cpu))


if __name__ == "__main__":
    main()
