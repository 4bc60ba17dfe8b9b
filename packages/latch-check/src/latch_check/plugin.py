"""latch-check's registrations with Latch (entry point group latch.plugins).

Commands (latch_check.commands, which imports no torch): ``compile`` (the whole pipeline on an
example, run on the GPU or the arena simulator; latch_check.pipeline), ``check`` (captured program
vs eager PyTorch, FP64; latch_check.compare), ``simulate`` (schedule + memory plan on the CPU arena
simulator vs the FP64 interpreter; latch_check.simulator).
"""

from latch_core.hookspecs import hookimpl


@hookimpl
def latch_register_commands(register):
    from .bench_matmul import bench_matmul_command
    from .bench_memory import bench_memory_command
    from .commands import check_command, compile_command, simulate_command

    register(bench_matmul_command)
    register(bench_memory_command)
    register(check_command)
    register(compile_command)
    register(simulate_command)
