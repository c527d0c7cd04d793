"""Wire formats across ranks (tests/workers/wire_mpi.py): one launch per P does it all.

compact == coo bitwise for every sparse algorithm, op, dtype, width and input pattern (empty
ranks, indices near 2**31 and 2**40) and every top-k algorithm; cost models == comm.stats for
coo, compact and rounded values; error feedback's mass conservation with bfloat16/float16
values over many steps for every top-k algorithm; bad ``wire`` / ``wire_values`` on one rank
raise InvalidArgument on every rank.
"""

import pytest

from tests._mpi import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
def test_wire_formats_exact_modelled_and_mass_conserving(nprocs):
    out = run_mpi(nprocs, "wire_mpi.py", 11 + nprocs, timeout=600 + 150 * nprocs)
    assert f"ok wire on {nprocs} ranks" in out
