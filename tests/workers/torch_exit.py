"""Process exits with torch groups in use: every rank must exit 0.

    mpiexec -n 4 python -m mpi4py tests/workers/torch_exit.py [callbacks]

Default: a cupycoll default group with a gloo subgroup used, destroyed, then the exit (rank
0's TCPStore, under the gloo subgroup's store, must outlive the other ranks' teardown;
``cupycoll._torch_world._leave_together``). ``callbacks``: the exit comes right after an
asynchronous allreduce whose Future callback waits for a second one (torch's PowerSGD hook
does) and one whose callback only sleeps: the exit lets both finish, printing their results
(before: the first was dropped and the second aborted the process, "terminate called without
an active exception": the callback was still in torch's C++ when the interpreter ended; and,
with a background worker's operation first, the nested one was dropped). ``unmatched``: rank
0 alone starts an asynchronous sparse allreduce, which the background worker runs, and exits:
after the exit's waits it ends that call (before: the interpreter waited for the worker's
thread for the group's timeout, 30 minutes). ``thread``: a call the last rank joins 7 s late,
which a thread of the program's own waits for after the main thread ended: it completes.
"""

import sys
import time

import torch
import torch.distributed as dist

import cupycoll.torch  # noqa: F401  registers "cupycoll" and cupycoll://

dist.init_process_group("cupycoll", init_method="cupycoll://")
if sys.argv[1:] == ["callbacks"]:
    rank, size = dist.get_rank(), dist.get_world_size()

    def nested(future):
        time.sleep(0.2)  # the main thread is exiting by now
        second = dist.all_reduce(torch.ones(3), async_op=True).get_future().wait()[0]
        print(f"rank {rank}: nested {second.tolist()}", flush=True)
        return second

    def sleepy(future):
        time.sleep(0.3)
        print(f"rank {rank}: sleepy {future.value()[0].tolist()}", flush=True)
        return future.value()

    # first, an operation of the background worker (a CPU sparse allreduce): no completer yet
    dist.all_reduce(torch.eye(2).to_sparse(), async_op=True).wait()
    # the nested collective is the last one issued (from the callback's thread): ranks issue
    # their collectives in one order
    dist.all_reduce(torch.full((2,), 2.0), async_op=True).get_future().then(sleepy)
    dist.all_reduce(torch.ones(2), async_op=True).get_future().then(nested)
elif sys.argv[1:] == ["unmatched"]:  # rank 0 alone starts a sparse allreduce (on the
    if dist.get_rank() == 0:  # background worker: its peers never join it) and exits
        dist.all_reduce(torch.eye(2).to_sparse(), async_op=True)
    print(f"rank {dist.get_rank()}: leaves", flush=True)
elif sys.argv[1:] == ["thread"]:  # a call the last rank joins 7 s late, which a thread of
    import threading  # the program's own waits for after the main thread ended: it completes

    rank = dist.get_rank()
    dist.all_reduce(torch.eye(2).to_sparse(), async_op=True).wait()  # (the workers exist)
    if rank == dist.get_world_size() - 1:
        time.sleep(7.0)
    work = dist.all_reduce(torch.eye(2).to_sparse(), async_op=True)
    threading.Thread(target=lambda: print(
        f"rank {rank}: waited {work.wait() and work.result()[0].to_dense().tolist()}",
        flush=True)).start()
else:
    gloo = dist.new_group(backend="gloo")
    for _ in range(8):
        dist.all_reduce(torch.ones(4), group=gloo)
    dist.destroy_process_group()
