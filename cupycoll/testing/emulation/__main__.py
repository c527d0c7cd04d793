"""``mpiexec -n P python -m cupycoll.testing.emulation [options] script.py [args]``: run a
script on emulated GPUs.

Options before the script: ``--devices-per-node N`` (default 2), ``--cupy-version 13|14``.
The NCCL call logs are compared across ranks when the script ends.
"""

import argparse
import runpy
import sys

from . import check_logs, install

parser = argparse.ArgumentParser(prog="python -m cupycoll.testing.emulation",
                                 description="Run a script on emulated GPUs (cupy replaced).")
parser.add_argument("--devices-per-node", type=int, default=2, metavar="N",
                    help="emulated GPUs per node (default 2)")
parser.add_argument("--cupy-version", type=int, default=14, choices=(13, 14),
                    help="the CuPy major version whose NCCL binding is emulated")
parser.add_argument("script", help="the Python script to run")
parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
options = parser.parse_args()
if options.devices_per_node < 1:
    parser.error("--devices-per-node must be at least 1")
install(options.devices_per_node, options.cupy_version)
sys.argv = [options.script, *options.args]
runpy.run_path(options.script, run_name="__main__")
check_logs()
