"""Each algorithm's fixed cost today against a profile's: ``tune``'s measurement of ``fixed``
(the small call of ``FIXED_N`` positions, ``FIXED_ENTRIES`` a rank, timed in turn over
``--passes`` passes, minus what the profile's other prices model), its ratio to the profile's
``fixed``, and the re-priced value: today's cost times the median of those ratios.

The re-priced values keep the profile's level (its alpha, beta and gamma were measured on the
day it was tuned, at that day's speed of the machine) and take today's relations between the
algorithms' fixed costs, which move as their code changes (docs/tuning.md, "Fixed costs
re-priced"). Run under mpiexec at the profile's P; the profile is the communicator's
(``CUPYCOLL_PROFILE``, else the shipped one):

    mpiexec -n 2 python -m mpi4py bench/dev/bench_fixed.py --passes 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from cupycoll._arguments import positive_int
import cupycoll as cc
from cupycoll.primitives import _accel
from cupycoll.tuner import calibrate
from cupycoll.tuner.profile import profile_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5, help="fixed-cost passes (median)")
    parser.add_argument("--repeats", type=positive_int, default=15, help="calls a pass times each")
    args = parser.parse_args()
    comm = cc.init("mpi")
    _accel.ready()  # numba's loops where they run, as tune measures them
    profile = profile_for(comm)
    passes = [calibrate._fixed_pass(comm, args.repeats) for _ in range(args.passes)]
    today = calibrate._fixed(comm, passes, dataclasses.replace(profile, fixed={}))
    if comm.rank:
        return
    ratios = {name: profile.fixed[name] / cost for name, cost in today.items()
              if cost > 0 and name in profile.fixed}
    level = statistics.median(ratios.values()) if ratios else float("nan")
    repriced = {name: cost * level for name, cost in today.items()}
    print(f"# P = {comm.size}, profile {profile.name}: fixed costs (us); median profile/today "
          f"{level:.2f}")
    print(f"# {'algorithm':>18} {'profile':>9} {'today':>9} {'ratio':>7} {'repriced':>9}")
    for name in sorted(today):
        ratio = f"{ratios[name]:.2f}" if name in ratios else "-"
        print(f"  {name:>18} {profile.fixed.get(name, float('nan')) * 1e6:9.1f} "
              f"{today[name] * 1e6:9.1f} {ratio:>7} {repriced[name] * 1e6:9.1f}")
    print("# repriced " + json.dumps(repriced, sort_keys=True))


if __name__ == "__main__":
    main()
