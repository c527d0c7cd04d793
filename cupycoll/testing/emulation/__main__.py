"""``mpiexec -n P python -m cupycoll.testing.emulation script.py [args]``: run a script on
emulated GPUs.

Options before the script: ``--devices-per-node N`` (default 2), ``--cupy-version 13|14``.
The NCCL call logs are compared across ranks when the script ends.
"""

import runpy
import sys

from . import check_logs, install

args = sys.argv[1:]
options = {"--devices-per-node": 2, "--cupy-version": 14}
while args and args[0] in options:
    options[args[0]] = int(args[1])
    args = args[2:]
if not args:
    sys.exit(__doc__)
install(options["--devices-per-node"], options["--cupy-version"])
sys.argv = args
runpy.run_path(args[0], run_name="__main__")
check_logs()
